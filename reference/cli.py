"""``turnkv-rollout``: an agentic multi-turn rollout on the embedded default model.

Each sequence generates an assistant turn, pauses with its KV cache kept, receives the
built-in tool's observation and resumes with only ``[pending token] + observation``
prefilled. A progress bar runs while it works; a per-turn table follows; trajectories are
written as JSONL.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table
from tqdm import tqdm

from .errors import TurnKVError
from .tool_env import EchoToolEnv
from .types import SamplingParams


def build_engine(args: argparse.Namespace):
    kw = dict(block_size=args.block_size, split_kv=args.split_kv, dtype=args.dtype)
    if args.engine == "reference":
        from .engine import Engine
        return Engine.from_pretrained(args.model, seed=args.weights_seed, **kw)
    import optimized
    return optimized.Engine.from_pretrained(args.model, seed=args.weights_seed, device=args.device, **kw)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="turnkv-rollout", description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", choices=["reference", "optimized"], default="reference")
    p.add_argument("--model", default="tiny", help="a named config (tiny, qwen3-0.6b, ...) or a checkpoint directory")
    p.add_argument("--device", default="cuda:0", help="device of the optimized engine")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default=None,
                   help="default: float32 for the reference, bfloat16 for the optimized engine")
    p.add_argument("--batch-size", type=int, default=8, help="sequences rolled out together")
    p.add_argument("--turns", type=int, default=4, help="assistant turns per sequence")
    p.add_argument("--prompt-len", type=int, default=24)
    p.add_argument("--max-tokens", type=int, default=16, help="token budget of one turn")
    p.add_argument("--max-obs", type=int, default=40, help="longest tool observation")
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--seed", type=int, default=0, help="sampling and prompt seed")
    p.add_argument("--weights-seed", type=int, default=0)
    p.add_argument("--stop-token", type=int, action="append", default=None, help="stop token id (repeatable)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--split-kv", default="fixed:64")
    p.add_argument("--output", default="rollouts.jsonl", help="trajectories as JSONL")
    args = p.parse_args(argv)
    if args.dtype is None:
        args.dtype = "float32" if args.engine == "reference" else "bfloat16"
    return args


def run(args: argparse.Namespace, console: Console) -> list[dict]:
    eng = build_engine(args)
    vocab = eng.model_config.vocab_size
    stops = tuple(args.stop_token) if args.stop_token else ((eng.model_config.eos_token_id,)
                                                            if eng.model_config.eos_token_id is not None else ())
    rng = random.Random(args.seed)
    env = EchoToolEnv(vocab, max_obs=args.max_obs, seed=args.seed)
    sids = []
    for i in range(args.batch_size):
        prompt = [rng.randrange(vocab) for _ in range(args.prompt_len)]
        sp = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                            max_tokens=args.max_tokens, stop_token_ids=stops, seed=args.seed * 100_003 + i)
        sids.append(eng.rollout_add(prompt, sp))
    rows = []
    active = set(sids)
    t0 = time.perf_counter()
    with tqdm(total=args.turns * args.batch_size, desc="turns", unit="turn", file=sys.stderr) as bar:
        for turn in range(args.turns):
            t = time.perf_counter()
            outs = eng.rollout_run_turns()
            dt = time.perf_counter() - t
            rows.append({
                "turn": turn, "seqs": len(outs), "generated": sum(len(o.token_ids) for o in outs.values()),
                "prefilled": sum(o.prefilled_tokens for o in outs.values()),
                "reprefill": sum(o.context_len for o in outs.values()),
                "blocks": eng.num_blocks - eng.num_free_blocks, "seconds": dt,
                "stops": sum(o.stop_reason == "stop_token" for o in outs.values()),
            })
            bar.update(len(outs))
            for sid, out in outs.items():
                if out.finished:
                    active.discard(sid)
                elif turn + 1 < args.turns:
                    eng.rollout_continue(sid, env.observe(sid, turn, out.token_ids))
            if not active:
                break
    trajectories = [eng.rollout_finish(s).to_dict() for s in sids]
    total = time.perf_counter() - t0
    table = Table(title=f"turnkv rollout: {args.engine} engine, model {args.model}, {args.batch_size} sequences")
    for col in ("turn", "seqs", "generated", "stop", "prefilled on resume", "full re-prefill", "blocks in use", "s"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(str(r["turn"]), str(r["seqs"]), str(r["generated"]), str(r["stops"]), str(r["prefilled"]),
                      str(r["reprefill"]), str(r["blocks"]), f"{r['seconds']:.2f}")
    console.print(table)
    saved = sum(r["reprefill"] - r["prefilled"] for r in rows[1:])
    console.print(f"{sum(r['generated'] for r in rows)} tokens generated in {total:.2f} s; resuming prefilled "
                  f"{sum(r['prefilled'] for r in rows[1:])} tokens where re-prefilling would have cost "
                  f"{sum(r['reprefill'] for r in rows[1:])} ({saved} saved); blocks free after finish: "
                  f"{eng.num_free_blocks}/{eng.num_blocks}")
    out = Path(args.output)
    with out.open("w") as f:
        for tr in trajectories:
            f.write(json.dumps(tr) + "\n")
    console.print(f"wrote {len(trajectories)} trajectories to {out}")
    return trajectories


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console()
    try:
        run(args, console)
    except TurnKVError as e:
        console.print(f"[red]error:[/red] {type(e).__name__}: {e}")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
