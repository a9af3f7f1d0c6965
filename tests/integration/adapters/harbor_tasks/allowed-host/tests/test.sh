#!/bin/bash
# Reward 1 only if the agent fetched the allowed host's answer and, now that the verifier
# runs with no network, that host is out of reach.
reward=1
if [ "$(cat /app/answer.txt 2>/dev/null)" != "ok" ]; then
  echo "no answer from allowed.corral.test in /app/answer.txt"
  reward=0
fi
if timeout 5 bash -c 'exec 3<>/dev/tcp/allowed.corral.test/8080' 2>/dev/null; then
  echo "allowed.corral.test is reachable during verification (no-network)"
  reward=0
fi
echo "$reward" > /logs/verifier/reward.txt
