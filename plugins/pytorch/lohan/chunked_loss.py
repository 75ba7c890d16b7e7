"""A linear head and cross-entropy computed a chunk of tokens at a time,
so that at most one chunk's logits exist, in forward and in backward.

`linear_cross_entropy(hidden, weight, bias, targets)` equals
`F.cross_entropy(F.linear(hidden, weight, bias).float(), targets)` (the
head in the model's dtype, the softmax in fp32, as Hugging Face's causal
LM loss does) without the N x vocab logits: forward keeps only the hidden
states, and backward makes each chunk's logits again from them (one more
head product per chunk: a third more of the head's FLOPs) and turns them
into the gradients of the hidden states and of the head. Across chunks the
head's weight gradient accumulates in fp32 and is rounded once to the
weight's dtype, as one matrix product over every token would be; one chunk
makes it in one product, as the model does.

In chunks of a multiple of ROW_MULTIPLE rows (the default chunk is one)
every head product is over a multiple of ROW_MULTIPLE rows: a last chunk
that is not (the tokens are not) is made over a window that takes in
rows of the chunk before it up to the next multiple, their results
dropped. MKL's fp32 GEMM (measured with 1 to 32 threads) rounds each row
of such a product as it does in the model's product over every token,
wherever the row is; a product of a few rows, not a multiple of 4, it
rounds differently, an ulp that training grows (docs/pytorch.md).
"""

from __future__ import annotations

from typing import Iterator, Optional, Tuple

import torch
from torch.nn import functional as F

# The default chunk holds at most this many bytes of fp32 logits.
DEFAULT_CHUNK_LOGIT_BYTES = 256 << 20
# Several chunks' head products are over a multiple of this many rows (see
# the top). plan/ counts the same (kLossChunkRowMultiple).
ROW_MULTIPLE = 8
# The head's weight gradient is added to its fp32 accumulator this many
# bytes of 16-bit product at a time (the vocabulary in slices), so the
# product needs no head-sized temporary. plan/ counts the same
# (kLossWeightGradSliceBytes).
_WEIGHT_GRAD_SLICE_BYTES = 64 << 20
# The logits' gradient is made this many bytes of fp32 rows at a time: the
# log-softmax, the nll gradient it starts from (dense) and their product
# exist a slice at a time.
_GRADIENT_SLICE_BYTES = 4 << 20


def default_chunk_tokens(vocab: int) -> int:
    """Tokens per chunk when none is given: the most whose fp32 logits are
    at most DEFAULT_CHUNK_LOGIT_BYTES, rounded down to a multiple of
    ROW_MULTIPLE, at least ROW_MULTIPLE (1,328 tokens for GPT-2's
    vocabulary, 520 for Llama 3's). plan/ counts the same rule."""
    tokens = DEFAULT_CHUNK_LOGIT_BYTES // (4 * max(1, vocab))
    return max(ROW_MULTIPLE, tokens // ROW_MULTIPLE * ROW_MULTIPLE)


def chunk_tokens_for(tokens: int, vocab: int, hidden: int) -> int:
    """The chunk when none is given, for `tokens` rows and a vocab x hidden
    head: default_chunk_tokens, or every token in one chunk when that holds
    no more at its peak (10 bytes a logit) than chunks do with the head's
    fp32 gradient accumulator (a short batch under a large head: one chunk
    needs no accumulator). Counted for 16-bit logits, as plan/'s
    CountModel does."""
    chunk = default_chunk_tokens(vocab)
    if tokens <= chunk:
        return tokens
    one = working_bytes(tokens, tokens, vocab, hidden)
    return tokens if one <= working_bytes(chunk, tokens, vocab,
                                          hidden) else chunk


def working_bytes(chunk: int, tokens: int, vocab: int, hidden: int) -> int:
    """What the loss holds on the device at its peak besides the head's
    weights, gradient and input, for 16-bit logits (plan/'s
    ChunkedLossBytes): a chunk's logits, their fp32 copy and log-softmax
    in forward; with several chunks, in backward, the head's fp32 gradient
    accumulator and a chunk's softmax, or its 16-bit copy and a slice of
    the weight gradient's product."""
    chunk = min(chunk, tokens)
    logits = chunk * vocab
    if chunk >= tokens:
        return logits * 10
    head = vocab * hidden
    return max(logits * 10, 4 * head + max(
        logits * 6, logits * 2 + min(2 * head, _WEIGHT_GRAD_SLICE_BYTES)))


def check_chunk_tokens(chunk_tokens: object, option: str) -> int:
    """`chunk_tokens` as an int >= 1; ValueError naming `option`."""
    if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int) \
            or chunk_tokens < 1:
        raise ValueError(f"{option}={chunk_tokens!r}: an int >= 1 (tokens "
                         "whose logits exist at once), or None for the "
                         "default")
    return chunk_tokens


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor,
                         bias: Optional[torch.Tensor], targets: torch.Tensor,
                         *, chunk_tokens: Optional[int] = None,
                         ignore_index: int = -100,
                         divisor: Optional[object] = None) -> torch.Tensor:
    """The cross-entropy of `hidden @ weight.T + bias` against `targets`,
    a chunk of `chunk_tokens` rows at a time. hidden: [..., H]; weight:
    [V, H]; targets: hidden's leading shape, ignore_index where no token
    counts. The mean over counted tokens (NaN when none count, as torch),
    or the sum over `divisor` when one is given (a tensor or a number:
    Hugging Face's num_items_in_batch)."""
    rows = hidden.reshape(-1, hidden.shape[-1])
    flat_targets = targets.reshape(-1).to(rows.device)
    if flat_targets.numel() != rows.shape[0]:
        raise ValueError(f"linear_cross_entropy: {rows.shape[0]} hidden "
                         f"rows but {flat_targets.numel()} targets")
    chunk = (chunk_tokens_for(rows.shape[0], *weight.shape)
             if chunk_tokens is None
             else check_chunk_tokens(chunk_tokens, "chunk_tokens"))
    total = _ChunkedLinearCrossEntropy.apply(rows, weight, bias,
                                             flat_targets, chunk,
                                             ignore_index)
    if divisor is None:
        counted = (flat_targets != ignore_index).sum()
        return total / counted
    if torch.is_tensor(divisor):
        divisor = divisor.to(total.device)
    return total / divisor


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """The summed cross-entropy of rows x weight.T + bias; saves no
    logits."""

    @staticmethod
    def forward(ctx, rows: torch.Tensor, weight: torch.Tensor,
                bias: Optional[torch.Tensor], targets: torch.Tensor,
                chunk: int, ignore_index: int) -> torch.Tensor:
        total = torch.zeros((), dtype=torch.float32, device=rows.device)
        # The products' dtype: the operands', or autocast's, which backward
        # (outside autocast) takes again so its products round as the
        # model's own backward does.
        ctx.product_dtype = weight.dtype
        for begin, start, end in _windows(rows.shape[0], chunk):
            logits = F.linear(rows[begin:end], weight, bias)
            ctx.product_dtype = logits.dtype
            total += F.cross_entropy(logits[start - begin:].float(),
                                     targets[start:end],
                                     ignore_index=ignore_index,
                                     reduction="sum")
        ctx.save_for_backward(rows, weight, bias, targets)
        ctx.chunk, ctx.ignore_index = chunk, ignore_index
        return total

    @staticmethod
    def backward(ctx, grad_total: torch.Tensor
                 ) -> Tuple[Optional[torch.Tensor], ...]:
        rows, weight, bias, targets = ctx.saved_tensors
        if ctx.chunk >= rows.shape[0]:
            return _one_chunk_backward(ctx, grad_total)
        want_rows, want_weight, want_bias = ctx.needs_input_grad[:3]
        grad_rows = torch.empty_like(rows) if want_rows else None
        grad_weight = (torch.zeros(weight.shape, dtype=torch.float32,
                                   device=weight.device)
                       if want_weight else None)
        grad_bias = (torch.zeros(bias.shape, dtype=torch.float32,
                                 device=bias.device)
                     if want_bias else None)
        dtype = ctx.product_dtype
        weight_as, bias_as = weight.to(dtype), (
            None if bias is None else bias.to(dtype))
        for begin, start, end in _windows(rows.shape[0], ctx.chunk):
            part = rows[begin:end].to(dtype)
            grad_logits = _logits_gradient(
                part, weight_as, bias_as, targets[start:end],
                ctx.ignore_index, grad_total)
            if grad_rows is not None:
                grad_rows[start:end] = (grad_logits @ weight_as)[
                    start - begin:]
            # The window's rows before the chunk have a zero gradient.
            grad_logits, part = grad_logits[start - begin:], part[
                start - begin:]
            if grad_weight is not None:
                _add_weight_gradient(grad_weight, grad_logits, part)
            if grad_bias is not None:
                grad_bias += grad_logits.sum(0, dtype=torch.float32)
            del grad_logits
        return (grad_rows,
                None if grad_weight is None else grad_weight.to(weight.dtype),
                None if grad_bias is None else grad_bias.to(bias.dtype),
                None, None, None)


def _windows(tokens: int, chunk: int) -> Iterator[Tuple[int, int, int]]:
    """(begin, start, end) for each chunk of `chunk` of `tokens` rows: the
    chunk's rows are start:end, its products are made over begin:end.
    begin is start, or for a last chunk that is not a multiple of
    ROW_MULTIPLE rows, end less its rows rounded up to one, when that
    window is at most `chunk` rows and within the tokens (rows of the
    chunk before it, made again and dropped)."""
    for start in range(0, tokens, chunk):
        end = min(start + chunk, tokens)
        window = -(-(end - start) // ROW_MULTIPLE) * ROW_MULTIPLE
        yield (end - window if window <= min(chunk, end) else start,
               start, end)


def _one_chunk_backward(ctx, grad_total: torch.Tensor
                        ) -> Tuple[Optional[torch.Tensor], ...]:
    """Every token in one chunk: the head's products once each, as the
    model's own backward makes them (no accumulator)."""
    rows, weight, bias, targets = ctx.saved_tensors
    want_rows, want_weight, want_bias = ctx.needs_input_grad[:3]
    dtype = ctx.product_dtype
    weight_as = weight.to(dtype)
    part = rows.to(dtype)
    grad_logits = _logits_gradient(
        part, weight_as, None if bias is None else bias.to(dtype), targets,
        ctx.ignore_index, grad_total)
    return ((grad_logits @ weight_as).to(rows.dtype) if want_rows else None,
            (grad_logits.t() @ part).to(weight.dtype) if want_weight
            else None,
            grad_logits.sum(0, dtype=torch.float32).to(bias.dtype)
            if want_bias else None,
            None, None, None)


def _logits_gradient(rows: torch.Tensor, weight: torch.Tensor,
                     bias: Optional[torch.Tensor], targets: torch.Tensor,
                     ignore_index: int,
                     grad_total: torch.Tensor) -> torch.Tensor:
    """d(summed cross-entropy)/d(logits) x grad_total for one chunk's
    logits, made again, in their dtype, bit for bit as autograd makes it
    for `F.cross_entropy(logits.float(), targets, reduction="sum")`:
    torch's own log-softmax and log-softmax backward kernels (whose exp is
    not torch.exp's), fed nll's gradient (-grad_total at each counted
    target). A slice of rows at a time in fp32 (row by row the same
    arithmetic), so besides the logits only their gradient, in their
    dtype, is whole. `targets` are the last rows' (a window's, _windows):
    the rows before them get a zero gradient."""
    logits = F.linear(rows, weight, bias)
    grad = torch.empty_like(logits)
    skip = logits.shape[0] - targets.shape[0]
    grad[:skip] = 0
    logits = logits[skip:]
    counted = targets != ignore_index
    picked = torch.where(counted, targets, 0).unsqueeze(-1)
    nll = torch.where(counted, -grad_total.to(torch.float32),
                      torch.zeros((), dtype=torch.float32,
                                  device=logits.device)).unsqueeze(-1)
    # At most an eighth of the chunk a slice (its fp32 temporaries, about
    # 12 bytes a logit, then add 1.5 bytes a logit of the chunk to its
    # logits and their gradient: within what plan/ counts).
    step = max(1, min(_GRADIENT_SLICE_BYTES // (4 * max(1, logits.shape[-1])),
                      -(-logits.shape[0] // 8)))
    for start in range(0, logits.shape[0], step):
        end = start + step
        log_probs = torch.log_softmax(logits[start:end].float(), -1)
        upstream = torch.zeros_like(log_probs)
        upstream.scatter_(-1, picked[start:end], nll[start:end])
        grad[skip + start:skip + end] = (
            torch.ops.aten._log_softmax_backward_data(
                upstream, log_probs, -1, torch.float32))
    return grad


def _add_weight_gradient(accumulator: torch.Tensor, grad_logits: torch.Tensor,
                         rows: torch.Tensor) -> None:
    """accumulator (fp32, [V, H]) += grad_logits.T @ rows, the product in
    the rows' dtype (as the model's own backward makes it), a slice of the
    vocabulary at a time."""
    if rows.dtype == torch.float32:
        accumulator.addmm_(grad_logits.t(), rows)
        return
    step = max(1, _WEIGHT_GRAD_SLICE_BYTES
               // (rows.element_size() * max(1, rows.shape[-1])))
    for start in range(0, accumulator.shape[0], step):
        accumulator[start:start + step] += (
            grad_logits[:, start:start + step].t() @ rows)
