#!/bin/bash
# harbor's verifier: reward 1 when the answer is the seeded name (init.sql alone says 'factory_default').
mkdir -p /logs/verifier
if [ "$(cat /work/answer.txt 2>/dev/null)" = "baseline" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "answer: $(cat /work/answer.txt 2>/dev/null || echo '(none)')"
  echo 0 > /logs/verifier/reward.txt
fi
