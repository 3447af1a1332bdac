#!/bin/bash
# Reward 1 when the solution's first observation is exactly a fresh stack's.
mkdir -p /logs/verifier
if diff -u /tests/expected_first_seen.txt /logs/agent/first_seen.txt; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
