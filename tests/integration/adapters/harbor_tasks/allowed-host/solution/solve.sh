#!/bin/bash
set -eu
exec 3<>/dev/tcp/allowed.corral.test/8080
head -n 1 <&3 > /app/answer.txt
cat /app/answer.txt
