#!/usr/bin/env python3
"""evaluation_vs_transformers.py [--model DIR] [--examples N] [--threads 1,2] [--before BIN]: the
study's WordNet evaluation against transformers' plain forward on rows of the same shapes, side by
side in one run (docs/benchmarks.md, "Evaluation").

amaq: `amaq-study` on the report split with one training step at lr 1e-12 (the base model: LoRA's B
starts at zero), N evaluation examples in batches of 64, cut after layer 2, at most 48 tokens: the
split evaluation as a study run makes it (client layers, the codec, the server's layers and head,
the scores). Its JSON gives the evaluation's wall time and the tokens of the rows it computed
(padding included). transformers: the same model directory in fp32, `model(ids)` with the full
head and `model.model(ids)` without it, on random ids in batches of 64 rows of the evaluation's
mean row length, as many tokens in all; the first batch is not timed. --predictions DIR keeps the
current build's answers per example (the amaq-client key `predictions`). --before BIN times another
amaq-study (an older build) on the same examples the same way, its evaluation's time taken as its
run with N examples less its run with 1 (older builds do not record the evaluation's time).
Prints one JSON line per measurement and a markdown table; run it on a quiet machine.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TQDM_DISABLE", "1")
import torch  # noqa: E402
import transformers  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH = 64


def amaq_run(program, model, examples, threads, work, extra=()):
    """The JSON of one zero-shot amaq-study run evaluating `examples` report examples."""
    out = os.path.join(work, f"run-{len(os.listdir(work))}.json")
    command = [program, f"--model={model}", f"--data={ROOT}/data", "--task=wordnet", "--method=bf16", "--cut_layer=2",
               "--steps=1", "--lr=1e-12", "--batch=16", "--max_tokens=48", f"--eval_examples={examples}",
               f"--eval_batch={BATCH}", f"--threads={threads}", "--eval_split=report", f"--out={out}", "--progress=false", *extra]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, OMP_WAIT_POLICY="PASSIVE"))
    if done.returncode != 0:
        sys.exit(f"evaluation_vs_transformers: {program} failed:\n{done.stderr[-2000:]}")
    with open(out) as fh:
        result = json.load(fh)
    result["wall"] = time.perf_counter() - started
    return result


def transformers_rate(model_dir, tokens, examples, threads):
    """tokens/s of transformers' forward with and without the head on batches of BATCH random rows of
    the evaluation's mean length (tokens / examples), as many batches as the evaluation had."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    batches = math.ceil(examples / BATCH)
    length = max(1, round(tokens / examples))
    rates = {}
    for name, forward in (("full head", model), ("no head", model.model)):
        ids = torch.randint(0, model.config.vocab_size, (BATCH, length))
        with torch.inference_mode():
            forward(input_ids=ids)  # not timed
            started = time.perf_counter()
            for _ in range(batches):
                forward(input_ids=ids)
            rates[name] = batches * BATCH * length / (time.perf_counter() - started)
    return rates


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=os.path.join(ROOT, "models/smollm2-135m-instruct"))
    parser.add_argument("--examples", type=int, default=2000)
    parser.add_argument("--threads", default="1")
    parser.add_argument("--program", default=os.path.join(ROOT, "build/bin/amaq-study"))
    parser.add_argument("--before", help="an older build's amaq-study, timed on the same examples")
    parser.add_argument("--predictions", help="a folder for the current build's answers, predictions-<threads>.csv")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for threads in [int(t) for t in args.threads.split(",")]:
            extra = [f"--predictions={os.path.join(args.predictions, f'predictions-{threads}.csv')}"] if args.predictions else []
            new = amaq_run(args.program, args.model, args.examples, threads, work, extra)
            rate = new["eval_tokens"] / new["eval_seconds"]
            line = {"bench": "evaluation", "side": "amaq", "threads": threads, "examples": args.examples,
                    "metric": new["metric"], "eval_seconds": round(new["eval_seconds"], 1),
                    "eval_tokens": new["eval_tokens"], "tokens_per_s": round(rate, 1), "commit": new["build"]["commit"]}
            print(json.dumps(line), flush=True)
            before = None
            if args.before:
                whole, one = (amaq_run(args.before, args.model, n, threads, work) for n in (args.examples, 1))
                before = {"seconds": whole["wall"] - one["wall"], "metric": whole["metric"]}
                print(json.dumps({"bench": "evaluation", "side": "before", "threads": threads, "examples": args.examples,
                                  "metric": whole["metric"], "eval_seconds": round(before["seconds"], 1),
                                  "commit": whole["build"]["commit"]}), flush=True)
            theirs = transformers_rate(args.model, new["eval_tokens"], args.examples, threads)
            print(json.dumps({"bench": "evaluation", "side": "transformers", "threads": threads,
                              "tokens_per_s": {k: round(v, 1) for k, v in theirs.items()}, "torch": torch.__version__,
                              "transformers": transformers.__version__}), flush=True)
            rows.append((threads, new, rate, before, theirs))
    print(f"\n| threads | amaq evaluation of {args.examples} examples (s) | before (s) | amaq tokens/s | "
          "transformers forward, full head / no head (tokens/s) | amaq / transformers (full head) |")
    print("|---|---|---|---|---|---|")
    for threads, new, rate, before, theirs in rows:
        earlier = f"{before['seconds']:.0f}" if before else "-"
        print(f"| {threads} | {new['eval_seconds']:.0f} | {earlier} | {rate:.0f} | {theirs['full head']:.0f} / "
              f"{theirs['no head']:.0f} | {rate / theirs['full head']:.2f}x |")


if __name__ == "__main__":
    main()
