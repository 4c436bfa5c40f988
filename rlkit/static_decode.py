"""A decode loop with a static KV cache (``rollout.engine: hf_static``; docs/rollout-speed notes).

HF ``generate`` on the 4-bit path is launch-bound: its DynamicCache re-concatenates every layer's
keys and values each step, and its 2-D mask path syncs the host every step when rows are padded.
This loop instead

- keeps its keys and values in a static cache of its own (:class:`StaticKV`), allocated once for
  the call (prompt width + ``max_new_tokens``) and written at the columns rlkit gives it, never at
  a counter of transformers' (see :class:`StaticKV` for why that matters to a CUDA graph);
- passes a 4-D additive mask (transformers returns a 4-D mask as it is: no padding check, no
  host sync), kept in a fixed buffer whose column t is opened when token t is written;
- on CUDA, captures one decode step (the model forward over static input buffers) as a CUDA
  graph and replays it (:class:`CudaGraphStep`); a capture that fails falls back to eager with a
  warning giving the reason. On the CPU it runs eager, the same code otherwise;
  :class:`ReplayedStep` runs the capture's exact sequence on the CPU, so the tests check it there;
- with ``compile_step`` (``rollout.compile``, CUDA only), runs that decode step through
  ``torch.compile`` (fusing its small kernels) inside the graph; one compiled function serves
  every call, recompiling for a new model or shape, so the cache length is then rounded up to a
  multiple of `COMPILE_WIDTH` (calls whose prompts differ in width share a shape; the extra keys
  stay masked). Its compile time is what a GPU benchmark weighs against the faster step. On the
  CPU it warns and decodes eagerly;
- samples eagerly with rlkit's own chain (per-row temperature, top-k, top-p, the finiteness
  check: `rlkit.rollout.sampling_processors`), drawing exactly as HF's sampling step does
  (``multinomial(softmax(scores), 1)``), with EOS handling as HF's (finished rows emit padding;
  stop when every row has finished).

It returns the sampled tokens' log-probs under the distribution they were drawn from, for
truncated importance sampling (`rlkit.tis`): the static cache attends over a longer, masked key
range, so its logits differ from the training forward's by float rounding.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable

import torch
from transformers import LogitsProcessorList
from transformers.cache_utils import Cache

from rlkit.models.hf_compat import cache_keyword, causal_lm


def _additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where ``allowed``, the dtype's minimum elsewhere, in ``dtype`` (built in it: float64's
    minimum does not fit the float32 that ``torch.where`` makes of Python scalars)."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)


def _decode_mask(valid: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[B, 1, 1, K] additive mask: 0 where a key is valid, the dtype's minimum elsewhere."""
    return _additive_mask(valid, dtype)[:, None, None, :]


COMPILE_WIDTH = 128  # cache lengths a compiled decode step is built for: multiples of this


class StaticKV(Cache):
    """A static key/value cache that writes where rlkit says: one [B, H_kv, width, D] key buffer
    and one value buffer per decoder layer, each written at the columns of ``write_at`` (a long
    tensor rlkit sets before each forward) and returned whole (the 4-D mask hides the columns not
    written yet).

    Why not transformers' ``StaticCache``: its write position is an internal of each release. Up
    to 5.0 a layer writes at the caller's ``cache_position``; from 5.9 on (5.9.0 to 5.25.0 at
    least) at its own counter ``cumulative_length``, which every forward advances. A CUDA graph
    captured after a warm-up forward then replays from a counter one ahead of the step it
    decodes: token t's keys land in column t + 1 while the mask opens column t, so each query
    reads the previous token's keys twice and never its own. Here the position lives in
    ``write_at``, which the decoder fills before each step and the graph reads on every replay.

    It relies on one interface of transformers' attention layers, ``cache.update(keys, values,
    layer_idx, ...)``, the same from 4.57 to 5.25; its buffers are allocated by the first
    (prefill) forward, from the shapes and dtypes the layers pass, as HF's layers are.
    """

    def __init__(self, width: int):
        super().__init__(layers=[])  # no HF layers: this class stores the keys and values
        self.width = width
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.write_at = torch.zeros(1, dtype=torch.long)

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        """Write ``key_states``/``value_states`` [B, H_kv, n, D] at columns ``write_at`` [n];
        returns the layer's whole key and value buffers."""
        if layer_idx == len(self.keys):
            for buffers, states in ((self.keys, key_states), (self.values, value_states)):
                batch, heads, _, dim = states.shape
                buffers.append(states.new_zeros(batch, heads, self.width, dim))
        self.keys[layer_idx].index_copy_(2, self.write_at, key_states)
        self.values[layer_idx].index_copy_(2, self.write_at, value_states)
        return self.keys[layer_idx], self.values[layer_idx]


def _decode_forward(model, cache_keyword, cache, token, mask, position, cache_position):
    """One decode step's logits [B, V] over the static buffers."""
    out = model(
        input_ids=token,
        attention_mask=mask,
        position_ids=position,
        cache_position=cache_position,
        **{cache_keyword: cache},
        use_cache=True,
    )
    return out.logits[:, -1]


@functools.cache
def _compiled_decode_forward():
    """`_decode_forward` under ``torch.compile``, made once (compiles lazily, per model and shape)."""
    return torch.compile(_decode_forward, dynamic=False)


class CudaGraphStep:
    """A decode step ``forward`` (a function of static buffers only) captured as a CUDA graph.

    The sequence is CUDA's: a warm-up run on a side stream (the allocator's pools, lazy
    initialisation), which executes and so writes the cache once; then the capture, which records
    the kernels without executing them; then each :meth:`replay` executes the recorded kernels on
    the buffers' current contents, writing into the same output tensor.
    """

    def __init__(self, forward: Callable[[], torch.Tensor]):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            forward()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.output = forward()

    def replay(self) -> torch.Tensor:
        self.graph.replay()
        return self.output


class ReplayedStep:
    """:class:`CudaGraphStep`'s sequence without CUDA: the warm-up forward executes (and writes
    the cache, as on CUDA), the capture executes nothing, and every :meth:`replay` runs the step
    function again on the buffers' current contents. A capture that depends on state the warm-up
    left behind (a cache's own write counter, say) decodes wrong tokens here as on a GPU, so the
    tests check the graph path on the CPU (tests/test_engines.py)."""

    def __init__(self, forward: Callable[[], torch.Tensor]):
        forward()  # the warm-up
        self.forward = forward

    def replay(self) -> torch.Tensor:
        return self.forward()


def step_graph_for(device: torch.device) -> type | None:
    """How a decode step is captured on ``device``: a CUDA graph on CUDA, not at all elsewhere."""
    return CudaGraphStep if device.type == "cuda" else None


class StaticDecoder:
    """One call's prefill and decode steps over a static cache (see the module docstring)."""

    def __init__(
        self,
        model: torch.nn.Module,
        batch: int,
        prompt_width: int,
        max_new_tokens: int,
        compile_step: bool = False,
    ):
        self.model = model
        self.cache_keyword = cache_keyword(causal_lm(model))
        self.width = prompt_width + max_new_tokens
        if compile_step:  # one compiled shape for calls whose prompt widths differ
            self.width = -(-self.width // COMPILE_WIDTH) * COMPILE_WIDTH
        self.dtype = next(model.parameters()).dtype
        self.device = next(model.parameters()).device
        self.cache = StaticKV(self.width)
        self.token = torch.zeros(batch, 1, dtype=torch.long, device=self.device)
        self.position = torch.zeros(batch, 1, dtype=torch.long, device=self.device)
        self.cache_position = torch.zeros(1, dtype=torch.long, device=self.device)
        self.mask = torch.zeros(batch, 1, 1, self.width, dtype=self.dtype, device=self.device)
        self.step_graph = step_graph_for(self.device)
        self.graph = None
        self.eager_reason = "no CUDA device" if self.step_graph is None else None
        self.decode_forward = _decode_forward
        if compile_step and self.device.type != "cuda":
            warnings.warn(
                "rollout.compile: torch.compile of the decode step needs CUDA here "
                "(no CUDA device); decoding eagerly",
                stacklevel=3,
            )
        elif compile_step:
            self.decode_forward = _compiled_decode_forward()

    def _forward(self) -> torch.Tensor:
        return self.decode_forward(
            self.model,
            self.cache_keyword,
            self.cache,
            self.token,
            self.mask,
            self.position,
            self.cache_position,
        )

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Run the left-padded prompts; returns the first step's logits [B, V]."""
        width = input_ids.shape[1]
        positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        keys = torch.zeros(input_ids.shape[0], self.width, dtype=torch.bool, device=self.device)
        keys[:, :width] = attention_mask.bool()
        causal = torch.ones(width, self.width, dtype=torch.bool, device=self.device).tril()
        mask = _additive_mask(keys[:, None, :] & causal[None], self.dtype)
        self.cache.write_at = torch.arange(width, device=self.device)
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask[:, None],
            position_ids=positions,
            cache_position=self.cache.write_at,
            **{self.cache_keyword: self.cache},
            use_cache=True,
        )
        self.cache.write_at = self.cache_position  # every decode step writes where it says
        self.valid = keys
        self.next_position = positions[:, -1:] + 1
        self.step_index = width
        return out.logits[:, -1]

    def _capture(self) -> None:
        """Capture the decode step (once per call), or fall back to eager saying why."""
        try:
            self.graph = self.step_graph(self._forward)
        except Exception as err:  # any capture failure: eager is always correct
            self.eager_reason = f"CUDA graph capture failed ({type(err).__name__}: {err})"
            warnings.warn(
                f"rollout.engine=hf_static: {self.eager_reason}; decoding eagerly", stacklevel=3
            )

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Write ``tokens`` [B] at the next position; returns the next logits [B, V]."""
        self.valid[:, self.step_index] = True
        self.token.copy_(tokens[:, None])
        self.position.copy_(self.next_position)
        self.cache_position.fill_(self.step_index)
        self.mask.copy_(_decode_mask(self.valid, self.dtype))
        self.next_position += 1
        self.step_index += 1
        if self.graph is None and self.eager_reason is None:
            # the capture's warm-up forward writes this step's keys and values at
            # cache_position; the first replay below rewrites the same column with the same
            # values, since the cache writes where cache_position says (StaticKV)
            self._capture()
        if self.graph is not None:
            return self.graph.replay()
        return self._forward()


def static_generate(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    max_new_tokens: int,
    eos_ids: list[int],
    pad_id: int,
    processors: LogitsProcessorList | None,
    compile_step: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Generated ids [B, steps] (padding after EOS, as HF's) and, when sampling (``processors``
    given; None: greedy), the sampled tokens' log-probs [B, steps]; ``compile_step``: see
    :class:`StaticDecoder`."""
    batch = input_ids.shape[0]
    decoder = StaticDecoder(model, batch, input_ids.shape[1], max_new_tokens, compile_step)
    eos = torch.tensor(eos_ids, device=input_ids.device)
    finished = torch.zeros(batch, dtype=torch.bool, device=input_ids.device)
    tokens, logps = [], []
    sequence = input_ids
    logits = decoder.prefill(input_ids, attention_mask)
    for step in range(max_new_tokens):
        scores = logits.float()
        if processors is None:
            token = scores.argmax(-1)
        else:
            scores = processors(sequence, scores)
            # drawn as HF's sampling step draws, so a seed gives HF's tokens for equal logits
            token = torch.multinomial(scores.softmax(-1), num_samples=1).squeeze(1)
            logps.append(torch.log_softmax(scores, -1).gather(-1, token[:, None]).squeeze(1))
        token = torch.where(finished, pad_id, token)
        tokens.append(token)
        finished |= torch.isin(token, eos)
        if step == max_new_tokens - 1 or bool(finished.all()):
            break
        if processors is not None:  # processors may read the ids so far (HF's interface)
            sequence = torch.cat([sequence, token[:, None]], dim=1)
        logits = decoder.step(token)
    return torch.stack(tokens, 1), (torch.stack(logps, 1) if logps else None)
