#!/bin/bash
# Reward 1 only if: the agent saw denied.corral.test refused and allowed.corral.test
# reached; during verification the same holds; and the agent's leftover process is gone.
reward=1
expected=$'denied.corral.test refused\nallowed.corral.test reached'
if [ "$(cat /app/probe.txt 2>/dev/null)" != "$expected" ]; then
  echo "agent's probe: $(cat /app/probe.txt 2>/dev/null || echo missing)"
  reward=0
fi
if timeout 5 bash -c 'exec 3<>/dev/tcp/denied.corral.test/8080' 2>/dev/null; then
  echo "denied.corral.test is reachable during verification"
  reward=0
fi
if ! timeout 5 bash -c 'exec 3<>/dev/tcp/allowed.corral.test/8080' 2>/dev/null; then
  echo "allowed.corral.test is not reachable during verification"
  reward=0
fi
if pgrep -f corral-leftover >/dev/null; then
  echo "the agent's process survived its phase: $(pgrep -af corral-leftover)"
  reward=0
fi
echo "$reward" > /logs/verifier/reward.txt
