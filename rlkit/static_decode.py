"""A decode loop with a static KV cache (``rollout.engine: hf_static``; docs/rollout-speed notes).

HF ``generate`` on the 4-bit path is launch-bound: its DynamicCache re-concatenates every layer's
keys and values each step, and its 2-D mask path syncs the host every step when rows are padded.
This loop instead

- allocates a ``StaticCache`` sized for the call (prompt width + ``max_new_tokens``) once;
- passes a 4-D additive mask (transformers returns a 4-D mask as it is: no padding check, no
  host sync), kept in a fixed buffer whose column t is opened when token t is written;
- on CUDA, captures one decode step (the model forward over static input buffers) as a CUDA
  graph and replays it; a capture that fails falls back to eager with a warning giving the
  reason. On the CPU it runs eager, the same code otherwise;
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

import torch
from transformers import LogitsProcessorList, StaticCache


def _additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where ``allowed``, the dtype's minimum elsewhere, in ``dtype`` (built in it: float64's
    minimum does not fit the float32 that ``torch.where`` makes of Python scalars)."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)


def _decode_mask(valid: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[B, 1, 1, K] additive mask: 0 where a key is valid, the dtype's minimum elsewhere."""
    return _additive_mask(valid, dtype)[:, None, None, :]


COMPILE_WIDTH = 128  # cache lengths a compiled decode step is built for: multiples of this


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
        from rlkit.logprobs import _cache_keyword, causal_lm  # rlkit.logprobs imports rollout

        self.model = model
        self.cache_keyword = _cache_keyword(causal_lm(model))
        self.width = prompt_width + max_new_tokens
        if compile_step:  # one compiled shape for calls whose prompt widths differ
            self.width = -(-self.width // COMPILE_WIDTH) * COMPILE_WIDTH
        self.dtype = next(model.parameters()).dtype
        self.device = next(model.parameters()).device
        self.cache = StaticCache(config=model.config, max_cache_len=self.width)
        self.token = torch.zeros(batch, 1, dtype=torch.long, device=self.device)
        self.position = torch.zeros(batch, 1, dtype=torch.long, device=self.device)
        self.cache_position = torch.zeros(1, dtype=torch.long, device=self.device)
        self.mask = torch.zeros(batch, 1, 1, self.width, dtype=self.dtype, device=self.device)
        self.graph = None
        self.logits = None
        self.eager_reason = "no CUDA device" if self.device.type != "cuda" else None
        self.decode_forward = _decode_forward
        if compile_step and self.eager_reason:
            warnings.warn(
                f"rollout.compile: torch.compile of the decode step needs CUDA here "
                f"({self.eager_reason}); decoding eagerly",
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
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask[:, None],
            position_ids=positions,
            cache_position=torch.arange(width, device=self.device),
            **{self.cache_keyword: self.cache},
            use_cache=True,
        )
        self.valid = keys
        self.next_position = positions[:, -1:] + 1
        self.step_index = width
        return out.logits[:, -1]

    def _capture(self) -> None:
        """Capture one decode step as a CUDA graph (on CUDA, once per call), or say why not."""
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):  # warm-up outside the graph (allocator, lazy init)
                self._forward()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self.logits = self._forward()
            self.graph = graph
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
            # the first decode step is replayed from the graph below after its capture:
            # the capture's warm-up forward wrote this position already, and rewrites are exact
            self._capture()
        if self.graph is not None:
            self.graph.replay()
            return self.logits
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
