#!/bin/bash
set -eu
python3 -c 'import urllib.request as u; print(u.urlopen("http://127.0.0.1:8080/answer").read().decode())' > /app/answer.txt
cat /app/answer.txt
