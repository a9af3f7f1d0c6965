#!/bin/bash
# Reward 1 only if the agent fetched the web service's answer, and the service itself is
# under the verifier's allowlist: it reaches allowed.corral.test and is refused
# denied.corral.test (asked through its /reach endpoint, on localhost).
reward=1
ask() { python3 -c 'import sys, urllib.request as u; print(u.urlopen("http://127.0.0.1:8080" + sys.argv[1], timeout=20).read().decode())' "$1"; }
if [ "$(cat /app/answer.txt 2>/dev/null)" != "answer-from-web" ]; then
  echo "no answer from the web service in /app/answer.txt"
  reward=0
fi
if [ "$(ask /reach/allowed.corral.test)" != "reached" ]; then
  echo "the web service cannot reach allowed.corral.test"
  reward=0
fi
if [ "$(ask /reach/denied.corral.test)" != "refused" ]; then
  echo "the web service reaches denied.corral.test under the verifier's allowlist"
  reward=0
fi
if timeout 5 bash -c 'exec 3<>/dev/tcp/denied.corral.test/8080' 2>/dev/null; then
  echo "the sandbox reaches denied.corral.test under the verifier's allowlist"
  reward=0
fi
echo "$reward" > /logs/verifier/reward.txt
