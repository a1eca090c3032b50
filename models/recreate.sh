#!/usr/bin/env bash
# Re-create the shipped checkpoints: train each model on CPU, then store it with its model card.
# Fuzzy logic: about 12-22 min per model on 2 CPU cores; SRAVEN: about 35-60 min per model.
set -euo pipefail
cd "$(dirname "$0")/.."
for attention in softmax linear hyla; do
  latentcode train --preset fuzzy_logic --attention "$attention" --scale cpu --set frac_test=0.7 --out "runs/fuzzy_logic-$attention"
  python models/ship.py "runs/fuzzy_logic-$attention" "fuzzy_logic-$attention" --overwrite \
    --command "latentcode train --preset fuzzy_logic --attention $attention --scale cpu --set frac_test=0.7 --out runs/fuzzy_logic-$attention"
  latentcode train --preset sraven --attention "$attention" --scale cpu --out "runs/sraven-$attention"
  python models/ship.py "runs/sraven-$attention" "sraven-$attention" --overwrite \
    --command "latentcode train --preset sraven --attention $attention --scale cpu --out runs/sraven-$attention"
done
