/* The spm tokenizer: a SentencePiece model (Llama 2's and Mistral's
 * tokenizer.model, or one made with spm_train) through Debian's
 * libsentencepiece, behind the C interface of tokenizer.h.
 *
 * Encoding is SentencePiece's own, normalisation included (the model's
 * normalizer: nmt_nfkc by default, identity for Llama 2): the ids equal
 * spm_encode's, and decode(encode(x)) is SentencePiece's round trip, not
 * byte-exact in general (nmt_nfkc folds compatibility characters and turns
 * newlines and whitespace runs into one space; without byte_fallback a
 * character outside the vocabulary becomes <unk>).
 *
 * Any bytes are accepted, the ids are always spm_encode's (test/test_spm.sh
 * checks both kinds below), and the text goes to SentencePiece as it is:
 *  - invalid UTF-8: SentencePiece's normalizer reads each bad byte as
 *    U+FFFD, encoded as the model encodes U+FFFD: <unk> (a run of unknown
 *    characters is one <unk>, decoded as " \u2047 ") or, with byte_fallback
 *    (Llama 2), the bytes EF BF BD; so invalid bytes decode to U+FFFD;
 *  - NUL: an ordinary character (the text is passed with its length):
 *    <unk>, or the byte piece <0x00> with byte_fallback, which round-trips.
 * U+2581 in the text is SentencePiece's own space mark and decodes to ' '.
 *
 * No C++ exception or SentencePiece status crosses into C: every entry point
 * catches and returns one error line. */
#include <sentencepiece_processor.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <vector>

extern "C" {
#include "io/tokenizer.h"
}

namespace
{

const int SPM_MAX_SPECIAL = 3; /* <unk>, <s>, </s> */

struct spm_state {
    sentencepiece::SentencePieceProcessor sp;
    std::string special_text[SPM_MAX_SPECIAL]; /* owns what special_name points at */
    char *special_name[SPM_MAX_SPECIAL];
    int32_t special_id[SPM_MAX_SPECIAL];
};

spm_state *state(tokenizer_t *tk) { return static_cast<spm_state *>(tk->impl); }

/* A SentencePiece status as one line: its messages may end in a space or
 * hold newlines, and the caller prints exactly one line. */
std::string status_line(const sentencepiece::util::Status &st)
{
    std::string text = st.ToString();
    for (char &c : text)
        if (c == '\n' || c == '\r')
            c = ' ';
    while (!text.empty() && text.back() == ' ')
        text.pop_back();
    return text;
}

/* SentencePiece's Encode with its own normalisation, the whole text at once
 * (a document is one "sentence"; the ids are spm_encode's for the line). */
int spm_encode(tokenizer_t *tk, const char *text, size_t len, tok_ids_t *out, char *err, size_t errlen)
{
    try {
        std::vector<int> ids;
        const auto st = state(tk)->sp.Encode(absl::string_view(text, len), &ids);
        if (!st.ok()) {
            snprintf(err, errlen, "SentencePiece cannot encode %zu bytes: %s", len, status_line(st).c_str());
            return -1;
        }
        if (tok_ids_reserve(out, ids.size()) != 0) {
            snprintf(err, errlen, "out of memory encoding %zu bytes", len);
            return -1;
        }
        for (int id : ids)
            out->id[out->n++] = id;
        return 0;
    } catch (const std::exception &e) {
        snprintf(err, errlen, "SentencePiece encode failed: %s", e.what());
    } catch (...) {
        snprintf(err, errlen, "SentencePiece encode failed (unknown C++ exception)");
    }
    return -1;
}

/* Decode a run of ordinary ids (no control ids) with SentencePiece. */
int decode_run(const spm_state *s, const std::vector<int> &run, tok_bytes_t *out, char *err, size_t errlen)
{
    if (run.empty())
        return 0;
    std::string text;
    const auto st = s->sp.Decode(run, &text);
    if (!st.ok()) {
        snprintf(err, errlen, "SentencePiece cannot decode %zu ids: %s", run.size(), status_line(st).c_str());
        return -1;
    }
    if (tok_bytes_append(out, text.data(), text.size()) != 0) {
        snprintf(err, errlen, "out of memory decoding %zu ids", run.size());
        return -1;
    }
    return 0;
}

/* Control ids (<s>, </s>) decode to their piece text, as tokenizer.h asks of
 * special tokens, where SentencePiece would drop them; the runs between are
 * SentencePiece's own decoding, so a run that holds no control id gives
 * exactly spm_decode's bytes, and each document after a BOS loses its dummy
 * prefix space as it does when decoded alone. Ids are range-checked first:
 * for an id past the vocabulary SentencePiece's protobuf CHECK prints a
 * "libprotobuf FATAL" line of its own before it throws. */
int decode_ids(tokenizer_t *tk, const int32_t *ids, size_t n, tok_bytes_t *out, char *err, size_t errlen)
{
    const spm_state *s = state(tk);
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= tk->vocab_size) {
            snprintf(err, errlen, "token id %d at %zu is outside the SentencePiece vocabulary (0..%d)",
                     static_cast<int>(ids[i]), i, tk->vocab_size - 1);
            return -1;
        }
    std::vector<int> run;
    for (size_t i = 0; i < n; i++) {
        if (!s->sp.IsControl(ids[i])) {
            run.push_back(ids[i]);
            continue;
        }
        if (decode_run(s, run, out, err, errlen) != 0)
            return -1;
        run.clear();
        const std::string &piece = s->sp.IdToPiece(ids[i]);
        if (tok_bytes_append(out, piece.data(), piece.size()) != 0) {
            snprintf(err, errlen, "out of memory decoding %zu ids", n);
            return -1;
        }
    }
    return decode_run(s, run, out, err, errlen);
}

int spm_decode(tokenizer_t *tk, const int32_t *ids, size_t n, tok_bytes_t *out, char *err, size_t errlen)
{
    try {
        return decode_ids(tk, ids, n, out, err, errlen);
    } catch (const std::exception &e) {
        snprintf(err, errlen, "SentencePiece decode failed: %s", e.what());
    } catch (...) {
        snprintf(err, errlen, "SentencePiece decode failed (unknown C++ exception)");
    }
    return -1;
}

void spm_destroy(tokenizer_t *tk)
{
    delete state(tk);
    tk->impl = nullptr;
}

const tokenizer_ops_t spm_ops = {
    "spm",
    spm_encode,
    spm_decode,
    spm_destroy,
};

/* Record the special tokens the model defines (id >= 0), in id order of
 * kind: <unk>, <s>, </s>. */
void list_specials(tokenizer_t *tk, spm_state *s)
{
    const int ids[SPM_MAX_SPECIAL] = {s->sp.unk_id(), s->sp.bos_id(), s->sp.eos_id()};
    int n = 0;
    for (int id : ids) {
        if (id < 0 || id >= tk->vocab_size)
            continue;
        s->special_text[n] = s->sp.IdToPiece(id);
        s->special_name[n] = &s->special_text[n][0];
        s->special_id[n] = id;
        n++;
    }
    tk->special_name = s->special_name;
    tk->special_id = s->special_id;
    tk->n_special = n;
}

/* The ids placed around documents: BOS before each when the model has one,
 * EOS after each only when asked for (then the model must have one). */
int set_doc_ids(tokenizer_t *tk, const spm_state *s, const char *path, int add_eos, char *err, size_t errlen)
{
    int bos = s->sp.bos_id(), eos = s->sp.eos_id();
    tk->doc_start = bos >= 0 && bos < tk->vocab_size ? bos : TOK_NO_ID;
    if (!add_eos)
        return 0;
    if (eos < 0 || eos >= tk->vocab_size) {
        snprintf(err, errlen, "SentencePiece model '%s' defines no EOS (</s>) to end documents with: leave out --eos",
                 path);
        return -1;
    }
    tk->doc_end = eos;
    return 0;
}

/* Where the model lives: its absolute path, its sha256, and the canonical
 * spec "spm:" + that path (the sidecar records these). */
int identify_file(tokenizer_t *tk, const char *model, char *err, size_t errlen)
{
    if (realpath(model, tk->vocab_path) == nullptr) {
        snprintf(err, errlen, "cannot resolve the path of '%s': %s", model, strerror(errno));
        return -1;
    }
    if (tok_file_sha256(tk->vocab_path, tk->vocab_sha256, err, errlen) != 0)
        return -1;
    size_t len = strlen(tk->vocab_path);
    if (len + 5 > sizeof tk->spec) {
        snprintf(err, errlen, "the path of SentencePiece model '%s' is too long (%zu bytes)", model, len);
        return -1;
    }
    memcpy(tk->spec, "spm:", 4);
    memcpy(tk->spec + 4, tk->vocab_path, len + 1);
    return 0;
}

int open_model(tokenizer_t *tk, const char *model, int add_eos, char *err, size_t errlen)
{
    spm_state *s = new spm_state();
    tk->impl = s; /* freed by spm_destroy through tokenizer_close, on error too */
    tk->ops = &spm_ops;
    const auto st = s->sp.Load(model);
    if (!st.ok()) {
        snprintf(err, errlen, "cannot load SentencePiece model '%s': %s", model, status_line(st).c_str());
        return -1;
    }
    tk->vocab_size = s->sp.GetPieceSize();
    if (tk->vocab_size <= 0) {
        snprintf(err, errlen, "SentencePiece model '%s' has an empty vocabulary", model);
        return -1;
    }
    if (identify_file(tk, model, err, errlen) != 0)
        return -1;
    list_specials(tk, s);
    return set_doc_ids(tk, s, model, add_eos, err, errlen);
}

} // namespace

/* tk->vocab_path is TOK_PATH_MAX bytes: realpath needs PATH_MAX. */
static_assert(TOK_PATH_MAX >= PATH_MAX, "TOK_PATH_MAX must hold a realpath() result");

extern "C" int tok_spm_open(tokenizer_t *tk, const char *model, int add_eos, char *err, size_t errlen)
{
    try {
        return open_model(tk, model, add_eos, err, errlen);
    } catch (const std::bad_alloc &) {
        snprintf(err, errlen, "out of memory loading SentencePiece model '%s'", model);
    } catch (const std::exception &e) {
        snprintf(err, errlen, "cannot load SentencePiece model '%s': %s", model, e.what());
    } catch (...) {
        snprintf(err, errlen, "cannot load SentencePiece model '%s' (unknown C++ exception)", model);
    }
    return -1;
}
