/* Document masking (--doc-mask): where the documents of a packed batch lie,
 * in the form the model and the ops take (base/ops.h "Document positions").
 *
 * A batch row of T tokens holds several documents back to back. pos[b*T + t]
 * is the position of token t of row b within its document: 0 at a
 * document's first token, counting up by one to the next document's.
 * Attention then lets query t see keys t - pos .. t only (never a key of
 * another document), and RoPE and learned positions use pos instead of t,
 * so every document is computed as if it were alone in its row.
 *
 * The positions are the one interface: this file derives them from the
 * tokens (the boundary token dtrain-prepare placed between documents, as
 * the data's tokenizer sidecar names it); a reader that knows the document
 * offsets itself (a Megatron index) fills pos from them directly and hands
 * the model the same array. */
#ifndef DTRAIN_DOCMASK_H
#define DTRAIN_DOCMASK_H

#include <stddef.h>
#include <stdint.h>

/* pos[B*T] for tok[B*T]: a document begins at t = 0 of every row (a partial
 * document when tok[bT] is not a start), at each doc_start token, and after
 * each doc_end token. doc_start or doc_end < 0: that token is not used. */
void docmask_positions(const int32_t *tok, int B, int T, int32_t doc_start, int32_t doc_end, int32_t *pos);

/* Sum over the documents of n tokens (positions pos) of their squared
 * lengths: sum of 2 pos + 1 (a document of L tokens has positions 0..L-1,
 * and 1 + 3 + ... + (2L - 1) = L^2). Rows of T without documents give
 * n T: what the FLOPs convention counts for attention (src/model/flops.h), so
 * flops_per_token(c, sum / n) counts the attention masking computes. */
double docmask_square_sum(const int32_t *pos, size_t n);

#endif
