#!/bin/bash
# The oracle: read widget 1 through the API and write its name.
set -euo pipefail
curl -fsS "$WIDGETS_API/widgets/1" | python3 -c 'import json, sys; print(json.load(sys.stdin)["name"], end="")' > /work/answer.txt
echo "answer: $(cat /work/answer.txt)"
