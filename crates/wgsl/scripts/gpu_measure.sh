#!/usr/bin/env bash
# The GPU path's measurements on a machine with a GPU (the H200 device machine): the WGSL kernel's
# throughput on the models' shapes, then `node run` on the CPU and on the GPU for each model of
# `make_gpu_models.py`, prefill and cached decode, ids and hop hashes compared, with the GPU
# backend's profile (dispatches, submission, wait, read-back). Writes what it prints to $OUT/log.
#
#   crates/wgsl/scripts/gpu_measure.sh BIN [MODELS...]
#
# BIN holds `node` and `gemm_gpu` (the bench executable, `cargo bench -p daisy-wgsl --no-run`)
# built for that machine, and SmolLM2's config.json, tokenizer.json and tokenizer_config.json.
# MODELS default to `smollm2-shape q1b4`; CPU_BELOW_VALUES (e.g. "0 16777216") adds GPU runs with
# other DAISY_GPU_CPU_BELOW values; DECODE_TOKENS (e.g. 128) adds runs of that many tokens after a
# short prompt, whose profile is the decode's. The Vulkan loader must be installed (the device notes
# say how); VK_DRIVER_FILES may name the NVIDIA driver's manifest.
set -uo pipefail
BIN=$(realpath "${1:?usage: gpu_measure.sh BIN [MODELS...]}")
shift
MODELS=("${@:-smollm2-shape q1b4}")
read -r -a MODELS <<<"${MODELS[*]}"
OUT=${OUT:-/tmp/gpu-measure}
mkdir -p "$OUT"
LOG="$OUT/log"
: >"$LOG"
say() { echo "$@" | tee -a "$LOG"; }
HERE=$(dirname "$(realpath "$0")")
ROOT=$(realpath "$HERE/../../..")
MODEL_DIR=${MODEL_DIR:-/tmp/gpu-models}
export WGPU_BACKEND=${WGPU_BACKEND:-vulkan}

say "== machine"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv 2>&1 | tee -a "$LOG"
say "cpus: $(nproc)"

say "== models"
python3 "$HERE/make_gpu_models.py" --tokenizer "$BIN" --out "$MODEL_DIR" 2>&1 | grep -v Warning | tee -a "$LOG" &
MAKER=$!

say "== kernel (gpu_kernel: kernels alone; gpu_i32: with upload and read-back)"
"$BIN/gemm_gpu" --bench --warm-up-time 0.2 --measurement-time 0.6 \
    "${KERNEL_FILTER:-(gpu_kernel|gpu_kernel_tiled|gpu_i32)/(q1b4|smollm2_up|smollm2_lm)}" 2>&1 \
    | grep -E "adapter|^gpu_|thrpt" | tee -a "$LOG"
wait "$MAKER"

# A prompt of about 600 tokens: the start of the project's essay.
PROMPT=$(head -c "${PROMPT_BYTES:-2600}" "$ROOT/fixtures/text/essay.txt")
summary() { python3 "$HERE/run_summary.py" "$1"; }
for model in "${MODELS[@]}"; do
    for path in auto full-window; do
        for backend in cpu gpu; do
            say "== $model, $backend, path $path"
            new=${NEW_TOKENS:-32}; [ "$path" = auto ] || new=2
            "$BIN/node" run --model "$MODEL_DIR/$model" --prompt "$PROMPT" --max-new-tokens "$new" \
                --ignore-eos --backend "$backend" --path "$path" --format json 2>"$OUT/stderr-$model-$backend-$path" \
                | summary "$OUT/ids-$model-$backend-$path.json" | tee -a "$LOG"
            grep -E "^error|backend" "$OUT/stderr-$model-$backend-$path" | head -3 | tee -a "$LOG"
        done
        if cmp -s "$OUT/ids-$model-cpu-$path.json" "$OUT/ids-$model-gpu-$path.json"; then
            say "  ids and hop hashes: equal on cpu and gpu"
        else
            say "  ids and hop hashes: DIFFER between cpu and gpu"
        fi
        [ "$model" = q1b4 ] || break # full-window on the small model adds nothing
    done
done

# The GPU runs again with other sizes below which products stay on the CPU kernels
# (DAISY_GPU_CPU_BELOW; 0: every product on the GPU).
for below in ${CPU_BELOW_VALUES:-}; do
    for model in "${MODELS[@]}"; do
        say "== $model, gpu, path auto, DAISY_GPU_CPU_BELOW=$below"
        DAISY_GPU_CPU_BELOW=$below "$BIN/node" run --model "$MODEL_DIR/$model" --prompt "$PROMPT" \
            --max-new-tokens "${NEW_TOKENS:-32}" --ignore-eos --backend gpu --format json \
            2>"$OUT/stderr-$model-gpu-below-$below" \
            | summary "$OUT/ids-$model-gpu-below-$below.json" | tee -a "$LOG"
        if cmp -s "$OUT/ids-$model-cpu-auto.json" "$OUT/ids-$model-gpu-below-$below.json"; then
            say "  ids and hop hashes: equal on cpu and gpu"
        else
            say "  ids and hop hashes: DIFFER between cpu and gpu"
        fi
    done
done

# Decode alone: a short prompt and more tokens, so that the GPU profile is the decode's.
if [ -n "${DECODE_TOKENS:-}" ]; then
    SHORT=$(head -c 200 "$ROOT/fixtures/text/essay.txt")
    for model in "${MODELS[@]}"; do
        for backend in cpu gpu; do
            say "== $model, $backend, path auto, decode $DECODE_TOKENS tokens after a short prompt"
            "$BIN/node" run --model "$MODEL_DIR/$model" --prompt "$SHORT" --max-new-tokens "$DECODE_TOKENS" \
                --ignore-eos --backend "$backend" --format json 2>"$OUT/stderr-$model-$backend-decode" \
                | summary "$OUT/ids-$model-$backend-decode.json" | tee -a "$LOG"
        done
        if cmp -s "$OUT/ids-$model-cpu-decode.json" "$OUT/ids-$model-gpu-decode.json"; then
            say "  ids and hop hashes: equal on cpu and gpu"
        else
            say "  ids and hop hashes: DIFFER between cpu and gpu"
        fi
    done
fi
