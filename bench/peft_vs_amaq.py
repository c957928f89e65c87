#!/usr/bin/env python3
"""peft_vs_amaq.py [--model DIR] [--steps N] [--threads 1,2] [--variants fp32,...]: one LoRA fine-tune
step, amaq's in-process split step against transformers + peft, side by side in one run
(docs/benchmarks.md).

amaq: `amaq-study` with the fp32 method (the cut's activations and gradients cross uncompressed,
still through the codec and the gRPC messages' bytes), cut after layer 2, WordNet topics, batch 16,
at most 48 tokens, LoRA rank 16 / alpha 32 on q, k, v, o, gate, up and down of every layer, AdamW
at lr 0.002; its per-step CSV gives each step's wall time and its tokens (the fp32 activation's
bytes / (hidden * 4)). peft: the same model (the directory's safetensors, fp32) with
LoraConfig(r=16, lora_alpha=32, the same seven targets), AdamW at 0.002, one training step
(forward with labels, backward, optimizer step) on random token batches of exactly amaq's shapes,
step for step; and the same peft step over bitsandbytes' NF4 base (BitsAndBytesConfig load_in_4bit,
nf4, fp32 compute, prepare_model_for_kbit_training, on the CPU), the peer of amaq's NF4 base.
The first WARMUP steps of each are not timed. amaq runs once per variant (VARIANTS: its defaults
(compute_dtype auto), fp32 compute over fp32 base weights, bf16 compute on both parts, an NF4 base, both,
and 4 micro-batches a step instead of the default's whole steps in one process), each with the CPU time its process used over its wall time (load included: how many
cores it kept busy). Prints one JSON line per (side, variant, threads) and a markdown table; run it
on a quiet machine (it measures wall time).
"""
import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TQDM_DISABLE", "1")
import bitsandbytes  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
import peft  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
WARMUP = 2
FP32 = ["--compute_dtype=fp32", "--server_compute_dtype=fp32"]
BF16 = ["--compute_dtype=bf16", "--server_compute_dtype=bf16"]
VARIANTS = {
    "default": ["--compute_dtype=auto", "--server_compute_dtype=auto"],  # the programs' default (amaq-study's is fp32)
    "fp32": FP32,
    "bf16-compute": BF16,
    "nf4": ["--base_weights=nf4"] + FP32,
    "nf4+bf16-compute": ["--base_weights=nf4"] + BF16,
    "fp32-4-micro-batches": ["--micro_batches=4"] + FP32,  # the default until auto (1 in one process)
}


def amaq_steps(model, steps, threads, variant, work):
    """(tokens, seconds) of each timed step of an amaq-study run, and its CPU time over its wall time."""
    curve = os.path.join(work, f"amaq-{threads}-{len(os.listdir(work))}.csv")
    command = [os.path.join(ROOT, "build/bin/amaq-study"), f"--model={model}", f"--data={ROOT}/data",
               "--cut_layer=2", f"--steps={steps + WARMUP}", "--batch=16", "--max_tokens=48", "--lr=0.002",
               "--method=fp32", f"--threads={threads}", "--eval_examples=1", "--task=wordnet", "--seed=1",
               f"--out={curve}.json", f"--csv={curve}"] + VARIANTS[variant]
    before, started = os.times(), time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    after, wall = os.times(), time.perf_counter() - started
    busy = (after.children_user + after.children_system - before.children_user - before.children_system) / wall
    if done.returncode != 0:
        sys.exit(f"peft_vs_amaq: amaq-study failed:\n{done.stderr[-2000:]}")
    hidden = json.load(open(os.path.join(model, "config.json")))["hidden_size"]
    rows = [r for r in csv.DictReader(open(curve)) if r["metric"] == ""]
    return [(int(r["up_payload_bytes"]) // (hidden * 4), float(r["seconds"])) for r in rows[WARMUP:]], busy


def peft_steps(model_dir, shapes, threads, nf4_base=False):
    """Seconds of peft training steps on random batches of `shapes` ([rows, tokens] each), over the
    fp32 base or (nf4_base) bitsandbytes' 4-bit NF4 base."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    if nf4_base:
        nf4 = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                              bnb_4bit_compute_dtype=torch.float32)
        base = transformers.AutoModelForCausalLM.from_pretrained(model_dir, quantization_config=nf4, device_map="cpu")
        base = peft.prepare_model_for_kbit_training(base, use_gradient_checkpointing=False)
    else:
        base = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = peft.get_peft_model(base, peft.LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=TARGETS))
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.002)
    vocab = base.config.vocab_size
    seconds = []
    for i, (rows, tokens) in enumerate([shapes[0]] * WARMUP + shapes):
        ids = torch.randint(0, vocab, (rows, tokens))
        start = time.perf_counter()
        optimizer.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        if i >= WARMUP:
            seconds.append(time.perf_counter() - start)
    return seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=os.path.join(ROOT, "models/smollm2-135m-instruct"))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--variants", default="fp32", help="of " + ", ".join(VARIANTS) + " (comma-separated)")
    args = parser.parse_args()
    variants = args.variants.split(",")
    for v in variants:
        if v not in VARIANTS:
            sys.exit(f"peft_vs_amaq: unknown variant {v!r}: use {', '.join(VARIANTS)}")
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for threads in [int(t) for t in args.threads.split(",")]:
            peers = None
            for variant in variants:
                ours, busy = amaq_steps(args.model, args.steps, threads, variant, work)
                tokens = sum(t for t, _ in ours)
                amaq_rate = tokens / sum(s for _, s in ours)
                if peers is None:  # the same shapes in every variant: one run of each peer per thread count
                    peers = {}
                    for peer, nf4_base in (("peft", False), ("peft+bnb-nf4", True)):
                        theirs = peft_steps(args.model, [(16, t // 16) for t, _ in ours], threads, nf4_base)
                        peers[peer] = tokens / sum(theirs)
                        print(json.dumps({"bench": "peft_vs_amaq", "side": peer, "threads": threads, "steps": len(ours),
                                          "tokens": tokens, "tokens_per_s": round(peers[peer], 1),
                                          "torch": torch.__version__, "transformers": transformers.__version__,
                                          "peft": peft.__version__, "bitsandbytes": bitsandbytes.__version__}), flush=True)
                print(json.dumps({"bench": "peft_vs_amaq", "side": "amaq", "variant": variant, "threads": threads,
                                  "steps": len(ours), "tokens": tokens, "tokens_per_s": round(amaq_rate, 1),
                                  "cores_busy": round(busy, 2)}), flush=True)
                rows.append((threads, variant, amaq_rate, busy, peers))
    print("\n| threads | amaq variant | amaq split step (tokens/s) | amaq cores busy | peft, fp32 base (tokens/s) | "
          "amaq / peft | peft, bitsandbytes NF4 base (tokens/s) | amaq / peft NF4 |")
    print("|---|---|---|---|---|---|---|---|")
    for threads, variant, amaq_rate, busy, peers in rows:
        fp32, nf4 = peers["peft"], peers["peft+bnb-nf4"]
        print(f"| {threads} | {variant} | {amaq_rate:.0f} | {busy:.2f} | {fp32:.0f} | {amaq_rate / fp32:.2f}x | {nf4:.0f} | "
              f"{amaq_rate / nf4:.2f}x |")


if __name__ == "__main__":
    main()
