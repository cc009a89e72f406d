# SPDX-License-Identifier: Apache-2.0
"""A small, independent Python model of docs/semantics.md's rules: causal rows (bounded replay
included) and DSpark rows, the decode/prefill split, gather lens and the chunk plan. Used to check the binding's outputs on
random batches."""


def slot(bt_row, block_size, pos):
    return int(bt_row[pos // block_size]) * block_size + pos % block_size


def split(qsl, num_tokens, theta):
    """(num_decodes, num_prefills, num_decode_tokens, num_prefill_tokens)."""
    n = len(qsl) - 1
    qlens = [qsl[i + 1] - qsl[i] for i in range(n)]
    if not qlens or max(qlens) <= theta:
        return n, 0, num_tokens, 0
    first = next(i for i, q in enumerate(qlens) if q > theta)
    return first, n - first, qsl[first], num_tokens - qsl[first]


def token_to_req(qsl, num_tokens):
    out = [0] * num_tokens
    for r in range(len(qsl) - 1):
        for t in range(qsl[r], qsl[r + 1]):
            out[t] = r
    return out


def causal_row(bt_row, block_size, window, pos, replay_start=0):
    start = max(pos - (window - 1), 0, replay_start)
    return [slot(bt_row, block_size, p) for p in range(start, pos + 1)]


def noncausal_row(bt_row, block_size, window, prefix, seq_len):
    return [slot(bt_row, block_size, p) for p in range(max(prefix - window, 0), seq_len)]


def rows_for_tokens(qsl, seq, bt, slots, block_size, window, tokens, noncausal=False,
                    replay_start=None):
    """(rows, lens) for the tokens listed, padded tokens -> ([], 0); replay_start clamps causal
    rows (SWA bounded replay)."""
    req = token_to_req(qsl, len(slots))
    rows, lens = [], []
    for t in tokens:
        if slots[t] < 0:
            rows.append([])
            lens.append(0)
            continue
        r = req[t]
        ql = qsl[r + 1] - qsl[r]
        prefix = seq[r] - ql
        if noncausal:
            row = noncausal_row(bt[r], block_size, window, prefix, seq[r])
        else:
            row = causal_row(bt[r], block_size, window, prefix + t - qsl[r],
                             replay_start[r] if replay_start is not None else 0)
        rows.append(row)
        lens.append(len(row))
    return rows, lens


def pad(row, width):
    return row + [-1] * (width - len(row))


def chunk_plan(seq_cpu, ql_cpu, window, max_model_len, mnbt, ratio, chunk, has_compressed=None):
    if has_compressed is None:
        has_compressed = ratio > 1
    n = len(seq_cpu)
    if n == 0:
        return []
    area = chunk * ((-(-max_model_len // ratio) if has_compressed else 0) + window + mnbt)
    g = [q + min(max(s - q, 0), window - 1) for s, q in zip(seq_cpu, ql_cpu)]  # replay-free
    c = [s // ratio if has_compressed else 0 for s in seq_cpu]
    plan, start = [], 0
    while start < n:
        mc, mg, end = c[start], g[start], start + 1
        while end < n:
            mc2, mg2 = max(mc, c[end]), max(mg, g[end])
            if (end - start + 1) * (mc2 + mg2) > area:
                break
            mc, mg, end = mc2, mg2, end + 1
        plan.append((start, end, mc, mc + mg))
        start = end
    return plan
