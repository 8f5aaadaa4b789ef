"""``python -m reference.plan``: a dry run that prints, as JSON, what the engine would do for a
batch of sequence lengths — no model, no GPU.

It reports the split-KV policy in force and each sequence's splits (absolute key ranges), the
context-parallel ownership of every KV block (global block index -> rank, round robin), and
the launch guards' verdict on the block tables the block manager would build (or on a table
given with ``--table``).
"""

from __future__ import annotations

import argparse
import json

import torch

from .attention import check_block_tables, num_splits, split_size_for
from .config import EngineConfig, named_config
from .errors import TurnKVError
from .kv_cache import BlockManager


def plan(model: str, lens: list[int], block_size: int, split_kv: str, cp: int, batch_invariant: bool,
         num_blocks: int | None, table: list[list[int]] | None = None) -> dict:
    cfg = named_config(model)
    ecfg = EngineConfig(block_size=block_size, split_kv=split_kv, batch_invariant=batch_invariant, num_blocks=num_blocks)
    policy = ecfg.policy
    split = split_size_for(policy.kind, policy.split_size, lens, cfg.num_key_value_heads)
    blocks = BlockManager(num_blocks or sum(-(-n // block_size) for n in lens) + 1, block_size)
    tables: list[list[int]] = []
    if table is None:
        for n in lens:
            t: list[int] = []
            blocks.grow(t, n)
            tables.append(t)
    else:
        tables = table
    width = max([len(t) for t in tables] + [1])
    bt = torch.full((len(tables), width), -1, dtype=torch.long)
    for b, t in enumerate(tables):
        bt[b, :len(t)] = torch.tensor(t, dtype=torch.long)
    try:
        check_block_tables(bt, torch.tensor(lens), blocks.num_blocks, block_size)
        guard = {"ok": True}
    except TurnKVError as e:
        guard = {"ok": False, "error": type(e).__name__, "message": str(e)}
    seqs = []
    for b, n in enumerate(lens):
        size = split if split is not None else max(n, 1)
        k = num_splits(n, size)
        seqs.append({
            "len": n,
            "blocks": tables[b] if b < len(tables) else [],
            "splits": [[i * size, min((i + 1) * size, n)] for i in range(k)],
            "cp_owner": {str(j): j % cp for j in range(-(-n // block_size))},
        })
    return {"model": model, "block_size": block_size, "split_kv": str(policy), "split_size": split,
            "batch_invariant": batch_invariant, "cp_world": cp, "guards": guard, "sequences": seqs}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m reference.plan", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--lens", default="17,64,1", help="comma-separated cached lengths")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--split-kv", default="fixed:64")
    p.add_argument("--cp", type=int, default=1, help="context-parallel ranks")
    p.add_argument("--num-blocks", type=int, default=None)
    p.add_argument("--batch-invariant", action="store_true")
    p.add_argument("--table", default=None, help="JSON list of block tables to check instead of the planned ones")
    a = p.parse_args(argv)
    try:
        out = plan(a.model, [int(x) for x in a.lens.split(",") if x], a.block_size, a.split_kv, a.cp,
                   a.batch_invariant, a.num_blocks, json.loads(a.table) if a.table else None)
    except TurnKVError as e:
        print(json.dumps({"error": type(e).__name__, "message": str(e)}))
        return 2
    print(json.dumps(out, indent=2))
    return 0 if out["guards"]["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
