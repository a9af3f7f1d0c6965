#!/bin/bash
set -u
: > /app/probe.txt
for host in denied.corral.test allowed.corral.test; do
  if timeout 5 bash -c "exec 3<>/dev/tcp/$host/8080" 2>/dev/null; then
    echo "$host reached" >> /app/probe.txt
  else
    echo "$host refused" >> /app/probe.txt
  fi
done
cat /app/probe.txt
# A process the agent leaves behind: it must not outlive the agent's phase.
setsid nohup bash -c 'exec -a corral-leftover sleep 1000' >/dev/null 2>&1 < /dev/null &
