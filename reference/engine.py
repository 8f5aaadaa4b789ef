"""The reference engine: paused multi-turn rollout, spelled out.

What exactly happens on resume (``rollout_continue``)?

1. The sequence is PAUSED: its last sampled token (the *pending token*) is in ``token_ids``
   but has no K/V; every earlier token's K/V is still in its pages (``num_cached == len - 1``),
   unless memory pressure evicted them (then ``num_cached == 0`` and everything is recomputed).
2. The observation is appended to ``token_ids`` (assistant mask 0) and the sequence goes back
   to the WAITING queue. Nothing is computed yet.
3. At the next ``rollout_run_turns``, the scheduler admits it, grows its block table by the
   delta only, and prefills ``token_ids[num_cached:]`` = ``[pending] + observation``
   (in chunks if long) with paged continued prefill: each new query attends causally, by
   absolute position, over the cached prefix and the new tokens.
4. The last prefilled row's logits give the first token of the new turn, sampled with the
   randomness of its absolute position; decode steps follow until the turn ends.

Because positions, K/V and randomness depend only on the token ids, turn ``k`` of a
rollout equals single-shot ``generate`` over ``prompt + t1 + o1 + ... + o(k-1)``.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Iterable

import torch

from . import attention
from .config import EngineConfig, ModelConfig
from .errors import (ContextLimitError, ConfigError, InvalidTokenError, SequenceStateError,
                     UnknownSequenceError)
from .kernels import ReferenceKernels
from .kv_cache import BlockManager, KVCache, blocks_for
from .model import Qwen3Model
from .runner import ReferenceRunner, StepResult
from .scheduler import Scheduler, StepBatch
from .sequence import Sequence, SeqState
from .types import SamplingParams, Trajectory, TurnOutput
from .weights import check_weights, load_checkpoint, named_or_checkpoint

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class EngineCore:
    """Host-side rollout logic shared by every engine; a subclass supplies ``self.runner``."""

    name = "core"
    device = "cpu"

    def __init__(self, model_cfg: ModelConfig, engine_cfg: EngineConfig) -> None:
        self.model_config = model_cfg
        self.config = engine_cfg
        bs = engine_cfg.block_size
        limit = min(model_cfg.max_position_embeddings, engine_cfg.max_model_len or model_cfg.max_position_embeddings)
        num_blocks = engine_cfg.num_blocks or engine_cfg.max_num_seqs * blocks_for(limit, bs)
        # a single sequence must always fit in the pool, so nothing can deadlock
        self.max_model_len = min(limit, num_blocks * bs)
        self.num_blocks = num_blocks
        self.policy = engine_cfg.policy
        self.blocks = BlockManager(num_blocks, bs)
        self.scheduler = Scheduler(engine_cfg, self.blocks)
        self._seqs: dict[int, Sequence] = {}
        self._collected: set[int] = set()
        self._next_id = 0
        self._outbox: dict[int, TurnOutput] = {}   # turns completed while generate() ran
        self.logit_log: dict[int, list[torch.Tensor]] = {}   # per sequence, when record_logits(True)
        self.weights_version = 0

    # ---------------------------------------------------------------- validation
    def _tokens(self, ids: Any, what: str, allow_empty: bool) -> list[int]:
        if isinstance(ids, torch.Tensor):
            if ids.dim() != 1 or ids.dtype.is_floating_point or ids.dtype == torch.bool:
                raise InvalidTokenError(f"{what} must be a 1-D integer tensor, got {ids.dtype} {tuple(ids.shape)}")
            ids = ids.tolist()
        elif hasattr(ids, "tolist") and hasattr(ids, "dtype"):   # numpy arrays
            if getattr(ids, "ndim", 1) != 1 or ids.dtype.kind not in "iu":
                raise InvalidTokenError(f"{what} must be a 1-D integer array")
            ids = ids.tolist()
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
            raise InvalidTokenError(f"{what} must be a sequence of token ids, got {type(ids).__name__}")
        out = list(ids)
        V = self.model_config.vocab_size
        for t in out:
            if isinstance(t, bool) or not isinstance(t, int):
                raise InvalidTokenError(f"{what}: token {t!r} is not an int")
            if not 0 <= t < V:
                raise InvalidTokenError(f"{what}: token id {t} outside the vocabulary [0, {V})")
        if not out and not allow_empty:
            raise InvalidTokenError(f"{what} must not be empty")
        return out

    def _params(self, sp: Any) -> SamplingParams:
        if sp is None:
            return SamplingParams()
        if not isinstance(sp, SamplingParams):
            raise ConfigError(f"expected SamplingParams, got {type(sp).__name__}")
        return sp

    def _seq(self, sid: Any) -> Sequence:
        if isinstance(sid, bool) or not isinstance(sid, int):
            raise UnknownSequenceError(f"sequence id must be an int, got {sid!r}")
        if sid in self._collected:
            raise SequenceStateError(f"sequence {sid} was finished with rollout_finish and no longer exists")
        if sid not in self._seqs:
            raise UnknownSequenceError(f"unknown sequence id {sid}")
        return self._seqs[sid]

    # ---------------------------------------------------------------- public API
    def rollout_add(self, prompt_ids: Any, sp: SamplingParams | None = None) -> int:
        """Queue an agentic sequence; returns its id. Nothing runs until ``rollout_run_turns``."""
        return self._add(prompt_ids, sp, agentic=True)

    def _add(self, prompt_ids: Any, sp: SamplingParams | None, agentic: bool) -> int:
        prompt = self._tokens(prompt_ids, "prompt_ids", allow_empty=False)
        params = self._params(sp)
        if len(prompt) + 1 > self.max_model_len:
            raise ContextLimitError(f"prompt of {len(prompt)} tokens leaves no room to generate "
                                    f"(max_model_len {self.max_model_len})")
        sid = self._next_id
        self._next_id += 1
        seq = Sequence(sid, params, agentic, prompt, len(prompt))
        self._seqs[sid] = seq
        self.scheduler.add(seq)
        return sid

    def rollout_run_turns(self, max_steps: int | None = None) -> dict[int, TurnOutput]:
        """Run every waiting or running sequence until it pauses (turn end) or finishes.

        ``max_steps`` bounds the number of model steps (e.g. to stop early for a weight update);
        sequences whose turn has not ended then stay waiting or running, and ``abort`` can end it."""
        if max_steps is not None and max_steps < 0:
            raise ConfigError(f"max_steps must be >= 0, got {max_steps}")
        steps = 0
        while self.scheduler.has_work() and (max_steps is None or steps < max_steps):
            self._step()
            steps += 1
        out, self._outbox = self._outbox, {}
        return out

    def rollout_add_group(self, prompt_ids: Any, params: list[SamplingParams]) -> list[int]:
        """``len(params)`` agentic sequences of one prompt (GRPO). The prompt is prefilled once: its full
        blocks are shared, reference counted, and copied on write; each member samples with its own params."""
        prompt = self._tokens(prompt_ids, "prompt_ids", allow_empty=False)
        checked = [self._params(sp) for sp in params]
        if not checked:
            raise ConfigError("a group needs at least one SamplingParams")
        leader = self._add(prompt, checked[0], agentic=True)
        sids = [leader]
        for sp in checked[1:]:
            sid = self._next_id
            self._next_id += 1
            seq = Sequence(sid, sp, True, list(prompt), len(prompt))
            self._seqs[sid] = seq
            self._seqs[leader].followers.append(seq)   # held until the leader's prompt KV exists
            sids.append(sid)
        return sids

    def _shared_tokens(self, leader: Sequence) -> int:
        return (leader.prompt_len // self.config.block_size) * self.config.block_size

    def _release_followers(self, leader: Sequence) -> None:
        """Queue the held group members, sharing the leader's full prompt blocks (if it still holds them)."""
        n_blocks = leader.prompt_len // self.config.block_size
        share = leader.num_cached >= n_blocks * self.config.block_size and len(leader.block_table) >= n_blocks
        for seq in leader.followers:
            if seq.state != SeqState.WAITING:
                continue
            if share and n_blocks:
                seq.block_table = self.blocks.share(leader.block_table[:n_blocks])
                seq.num_cached = min(n_blocks * self.config.block_size, seq.prompt_len - 1)
            self.scheduler.add(seq)
        leader.followers = []

    def _unhold(self, seq: Sequence) -> None:
        """A group member still held for its leader's prompt KV leaves the leader's list (aborted or finished
        before the release): it is no longer the leader's to queue, and it prefills its own context if it
        continues. (Left there, a member aborted, then continued, then released, was queued twice.)"""
        for lead in self._seqs.values():          # (most lists are empty: released at the leader's first prefill)
            if lead.followers and any(f is seq for f in lead.followers):
                lead.followers = [f for f in lead.followers if f is not seq]

    def abort(self, sid: int) -> TurnOutput:
        """End the sequence's open turn now (stop reason ``aborted``) and pause it; returns the partial turn.

        Legal while a turn is open: WAITING (queued, resumed, or a group member held for its leader's prompt
        KV) or RUNNING after ``rollout_run_turns(max_steps=...)``."""
        seq = self._seq(sid)
        if seq.state not in (SeqState.WAITING, SeqState.RUNNING):
            raise SequenceStateError(f"sequence {sid} is {seq.state.value}: no open turn to abort")
        if seq.followers:
            self._release_followers(seq)
        self._unhold(seq)
        out = seq.end_turn("aborted", str(self.policy))
        self.scheduler.pause(seq)
        return out

    def update_weights(self, weights: Any, recompute_kv: bool = False) -> int:
        """Swap the model weights in place (a state dict, or a checkpoint directory); returns the new version.

        Cached KV was computed under the old weights. By default it is kept (stale, as most RL
        rollout engines do); ``recompute_kv=True`` drops it so every sequence's next prefill
        recomputes its context under the new weights. Each sampled token records the weights
        version that produced it (``Trajectory.weights_versions``, ``TurnOutput.weights_version``)."""
        if isinstance(weights, (str, Path)):
            cfg, weights = load_checkpoint(weights)
            if cfg.to_hf_dict() | {"eos_token_id": None} != self.model_config.to_hf_dict() | {"eos_token_id": None}:
                raise ConfigError("the checkpoint's config does not match the engine's model")
        if not isinstance(weights, dict):
            raise ConfigError(f"update_weights takes a state dict or a checkpoint directory, got {type(weights).__name__}")
        weights = dict(weights)
        if self.model_config.tie_word_embeddings:
            weights.pop("lm_head.weight", None)
        check_weights(self.model_config, weights)
        self._load_weights(weights)
        self.weights_version += 1
        if recompute_kv:
            self._flush_ops()
            for seq in self._seqs.values():
                if seq.state in (SeqState.WAITING, SeqState.PAUSED):
                    self.scheduler.drop_kv(seq)
                elif seq.state == SeqState.RUNNING:   # mid-turn: back to the queue, recomputed from scratch
                    self.scheduler.preempt(seq)
        return self.weights_version

    def _load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        raise NotImplementedError

    def rollout_continue(self, sid: int, observation_ids: Any = ()) -> None:
        """PAUSED -> WAITING with ``observation_ids`` appended; only ``[pending] + observation`` will be prefilled."""
        seq = self._seq(sid)
        if seq.state != SeqState.PAUSED:
            raise SequenceStateError(f"sequence {sid} is {seq.state.value}, only a paused sequence can continue")
        obs = self._tokens(observation_ids, "observation_ids", allow_empty=True)
        if seq.num_tokens + len(obs) + 1 > self.max_model_len:
            raise ContextLimitError(f"sequence {sid}: {seq.num_tokens} tokens + observation of {len(obs)} "
                                    f"leave no room to generate (max_model_len {self.max_model_len})")
        seq.add_observation(obs)
        self.scheduler.resume(seq)

    def rollout_finish(self, sid: int) -> Trajectory:
        """End a sequence in any state, free all its blocks, return its trajectory."""
        seq = self._seq(sid)
        if seq.followers:
            self._release_followers(seq)
        self._unhold(seq)
        if seq.state in (SeqState.WAITING, SeqState.RUNNING) and seq.num_tokens > seq.turn_start:
            seq.end_turn("aborted", str(self.policy))      # close the open turn so spans cover every token
        self.scheduler.finish(seq)
        self._flush_ops()                  # drops a host copy of its KV, if it was swapped out
        self._outbox.pop(sid, None)
        del self._seqs[sid]
        self._collected.add(sid)
        return seq.trajectory()

    def generate(self, prompts: Any, sp: SamplingParams | None = None) -> list[list[int]]:
        """Single-shot generation (no pause): the sampled tokens of each prompt."""
        if isinstance(prompts, torch.Tensor) or (prompts and isinstance(prompts[0], int)):
            raise InvalidTokenError("generate takes a list of prompts (a list of token-id lists)")
        checked = [self._tokens(p, f"prompts[{i}]", allow_empty=False) for i, p in enumerate(prompts)]
        for p in checked:
            if len(p) + 1 > self.max_model_len:
                raise ContextLimitError(f"prompt of {len(p)} tokens exceeds max_model_len {self.max_model_len}")
        params = self._params(sp)
        sids = [self._add(p, params, agentic=False) for p in checked]
        while any(self._seqs[s].state != SeqState.FINISHED for s in sids):
            self._step()
        results = []
        for s in sids:
            results.append(self._seqs[s].turn_tokens)
            self._outbox.pop(s, None)
            del self._seqs[s]
        return results

    @torch.no_grad()
    def score(self, token_ids: Any) -> torch.Tensor:
        """Teacher-forced logits of one sequence: float32 ``[T, vocab]`` on the CPU."""
        ids = self._tokens(token_ids, "token_ids", allow_empty=False)
        if len(ids) > self.max_model_len:
            raise ContextLimitError(f"{len(ids)} tokens exceed max_model_len {self.max_model_len}")
        self._flush_ops()
        return self._score(ids)

    # ---------------------------------------------------------------- introspection
    def state(self, sid: int) -> str:
        return self._seq(sid).state.value

    @property
    def num_free_blocks(self) -> int:
        return self.blocks.num_free

    def block_table(self, sid: int) -> list[int]:
        return list(self._seq(sid).block_table)

    def snapshot(self) -> dict:
        """A deep, comparable picture of the host state (for the 'state unchanged' checks)."""
        return {
            "free": sorted(self.blocks.free_pages()),
            "next_id": self._next_id,
            "collected": sorted(self._collected),
            "waiting": [s.seq_id for s in self.scheduler.waiting],
            "running": [s.seq_id for s in self.scheduler.running],
            "paused": [s.seq_id for s in self.scheduler.paused],
            "seqs": {sid: copy.deepcopy((s.state.value, s.token_ids, s.num_cached, s.block_table, s.assistant_mask,
                                         s.logprobs, [(x.kind, x.start, x.end) for x in s.spans], s.turn_index))
                     for sid, s in self._seqs.items()},
        }

    def record_logits(self, on: bool = True) -> None:
        """Keep the float32 logits row of every sampled token in ``logit_log[seq_id]`` (tests, INVARIANT)."""
        self.runner.record_logits = on
        if not on:
            self.logit_log.clear()

    # ---------------------------------------------------------------- one step
    def _step(self) -> None:
        batch = self.scheduler.schedule()
        if batch is None:
            return
        if batch.ops:
            self.runner.apply_ops(batch.ops)
        result = self._execute(batch)
        self._apply(batch, result)

    def _flush_ops(self) -> None:
        """Perform pending page operations now (before anything writes pages outside a step)."""
        ops = self.scheduler.take_ops()
        if ops:
            self.runner.apply_ops(ops)

    def _execute(self, batch: StepBatch) -> StepResult:
        raise NotImplementedError

    def _score(self, ids: list[int]) -> torch.Tensor:
        raise NotImplementedError

    def _apply(self, batch: StepBatch, result: StepResult) -> None:
        for seq, chunk in zip(batch.seqs, batch.chunks):
            seq.num_cached += chunk
            if batch.kind == "prefill":
                seq.turn_prefilled += chunk
            if seq.followers and seq.num_cached >= self._shared_tokens(seq):
                self._release_followers(seq)
        for i, (seq, tok, lp) in enumerate(zip(batch.sample_seqs, result.tokens, result.logprobs)):
            if result.logits is not None:
                self.logit_log.setdefault(seq.seq_id, []).append(result.logits[i].clone())
            seq.prefill_done = True
            seq.append_sampled(tok, lp, self.weights_version)
            if batch.kind == "decode":
                seq.turn_split_sizes.append(result.split_size)
            reason = None
            if seq.num_tokens >= self.max_model_len:
                reason = "context_limit"
            elif tok in seq.params.stop_token_ids:
                reason = "stop_token"
            elif seq.num_tokens - seq.turn_start >= seq.params.max_tokens:
                reason = "max_tokens"
            if reason is None:
                continue
            out = seq.end_turn(reason, str(self.policy))
            if out.finished:
                self.scheduler.finish(seq)
            else:
                self.scheduler.pause(seq)
            self._outbox[seq.seq_id] = out


class Engine(EngineCore):
    """The pure-PyTorch reference engine (CPU, float32 by default)."""

    name = "reference"

    def __init__(self, model_cfg: ModelConfig, weights: dict[str, torch.Tensor],
                 engine_cfg: EngineConfig | None = None) -> None:
        engine_cfg = engine_cfg or EngineConfig()
        super().__init__(model_cfg, engine_cfg)
        self.dtype = _DTYPES[engine_cfg.dtype]
        self.model = Qwen3Model(model_cfg, weights, self.dtype, batch_invariant=engine_cfg.batch_invariant,
                                rope_in_attention=engine_cfg.rope_in_attention)
        self.kv = KVCache(model_cfg.num_hidden_layers, self.num_blocks, engine_cfg.block_size,
                          model_cfg.num_key_value_heads, model_cfg.head_dim, self.dtype)
        self.runner = ReferenceRunner(self.model, self.kv, self.policy, engine_cfg.batch_invariant)
        self.kernels = ReferenceKernels(self.dtype)

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path, *, seed: int = 0, **engine_kwargs: Any) -> "Engine":
        """A named config with seeded random weights, or a Hugging Face checkpoint directory."""
        cfg, weights = named_or_checkpoint(name_or_path, seed)
        return cls(cfg, weights, EngineConfig(**engine_kwargs))

    @classmethod
    def from_state_dict(cls, cfg: ModelConfig, weights: dict[str, torch.Tensor], **engine_kwargs: Any) -> "Engine":
        return cls(cfg, weights, EngineConfig(**engine_kwargs))

    def _load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        self.model = Qwen3Model(self.model_config, weights, self.dtype, batch_invariant=self.config.batch_invariant,
                                rope_in_attention=self.config.rope_in_attention)
        self.runner.model = self.model

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self.model.w.items() if not (k == "lm_head.weight" and self.model_config.tie_word_embeddings)}

    @torch.no_grad()
    def _execute(self, batch: StepBatch) -> StepResult:
        return self.runner.execute(batch)

    def _score(self, ids: list[int]) -> torch.Tensor:
        cfg = self.model_config
        bs = self.config.block_size
        n = blocks_for(len(ids), bs)
        scratch = KVCache(cfg.num_hidden_layers, n, bs, cfg.num_key_value_heads, cfg.head_dim, self.dtype)
        T = len(ids)
        pos = torch.arange(T)
        table = torch.arange(n)[None, :]                                  # [1, n]
        lens = torch.tensor([T])
        qidx = torch.zeros(T, dtype=torch.long)

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            scratch.write(layer, pos, k, v)
            theta = cfg.rope_theta if self.model.rope_in_attention else None
            return attention.paged_prefill(q, scratch.k[layer], scratch.v[layer], table, lens, qidx, pos, rope_theta=theta)

        hidden = self.model.forward(torch.tensor(ids), pos, attend)
        return self.model.logits(hidden)
