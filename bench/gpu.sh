#!/usr/bin/env bash
# The GPU checks in one short run, for a machine with CUDA (about ten minutes on one H200): both benchmarks
# in bfloat16 against transformers, then the core's tests there (tests/core/test_cuda.py on the GPU).
#   bash bench/gpu.sh            # logs go to $OUT (the device tool's folder) or bench/results/
# The machine needs torch, transformers, safetensors, psutil and pytest; it needs no network. Where the real
# weights are not in weights/, the benchmarks use the model's shapes with seeded random weights (same speed).
# The app's tests (gradio, a browser) and the weight store's (PyPI) are not run here: they need no GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 GRADIO_ANALYTICS_ENABLED=False TOKENIZERS_PARALLELISM=false
out=${OUT:-bench/results}
mkdir -p "$out"
python3 - <<'EOF' 2>&1 | tee "$out/gpu-info.txt"
import datetime, torch, transformers
print(datetime.date.today(), "torch", torch.__version__, "transformers", transformers.__version__)
print("cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
EOF
model=smollm2-135m-instruct
random=--random-weights
[ -f "weights/$model/model.safetensors" ] && random=
status=0
timeout 210 python3 bench/generate.py --device cuda --model $model $random --compile --repeats 5 2>&1 \
  | grep -v "it/s]" | tee "$out/generate.txt" || status=1
timeout 170 python3 bench/attention.py --device cuda --model $model $random --repeats 3 2>&1 \
  | grep -v "it/s]" | tee "$out/attention.txt" || status=1
timeout 190 python3 -m pytest -q -rs tests/core/test_cuda.py tests/core/test_instrument.py tests/core/test_parity.py \
  tests/core/test_generate.py tests/core/test_attention.py tests/core/test_capture.py tests/core/test_loading.py 2>&1 \
  | tee "$out/tests.txt" || status=1
grep -h SUMMARY "$out/generate.txt" "$out/attention.txt"
tail -n 1 "$out/tests.txt"
exit $status
