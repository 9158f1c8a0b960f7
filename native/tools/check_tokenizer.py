#!/usr/bin/env python3
"""Compare the C engine's tokenizer with HF `tokenizers` built from the same GGUF.

    check_tokenizer.py MODEL.gguf TEXT_FILE [--engine native/build/colibri-engine]
                                            [--driver native/build/tok_ids] [--chunk 4096]
    check_tokenizer.py --make-corpus OUT [--size 1000000]     # mixed test text (deterministic)

The reference is tokenizers.models.BPE over the GGUF vocab + merges, pre-tokenizer
Sequence[Digits(individual_digits=True), ByteLevel(add_prefix_space=False, use_regex=True)]
for digit-splitting `tokenizer.ggml.pre` values (smollm, starcoder, refact), Split(pattern) then
ByteLevel(use_regex=False) for the llama3-family and o200k (gpt-4o) ones, ByteLevel alone
otherwise, with every control (3) / user-defined (4) vocab entry added as an atomic token;
ids as from encode(text, add_special_tokens=False).

The text file is cut into chunks at line ends; each chunk is tokenized by both sides.
Chunks that are valid UTF-8 go through HF's Tokenizer.encode as they are. HF cannot take
invalid UTF-8, so for the other chunks the reference is assembled from HF's parts with the
engine's documented rule (each byte that does not begin a well-formed sequence is one
character of class "other"): such bytes are replaced by a private-use placeholder (also
class "other") for HF's pre-tokenizer, then put back before HF's BPE model runs on each
pre-token. Exit status 0 only when every chunk matches.
"""
import argparse
import os
import random
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_tiny_moe import bytes_to_unicode  # noqa: E402  (one copy of GPT-2's byte map)

DIGIT_PRES = ("smollm", "starcoder", "refact")
# llama3-family Split patterns (tokenizer.json pre_tokenizer: Split(pattern, "isolated") then
# ByteLevel without its own regex); qwen2 isolates single digits, llama3 / glm4 runs of up to 3
L3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}%s| ?[^\s\p{L}\p{N}]+[\r\n]*|"
              r"\s*[\r\n]+|\s+(?!\S)|\s+")
L3_PRES = {"llama-bpe": "{1,3}", "llama3": "{1,3}", "glm4": "{1,3}", "qwen2": "", "deepseek-r1-qwen": ""}
# o200k (tokenizer.json of gpt-4o-style vocabularies, gpt-oss among them): the same
# Split-then-ByteLevel form, with case-aware letter classes
O200K_PATTERN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
                 r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
                 r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
                 r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
                 r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
O200K_PRES = ("gpt-4o", "llama4", "kanana2", "talkie")
PLACEHOLDER = "\ue000"


# ---------------------------------------------------------------- reference tokenizer
def load_gguf_vocab(path):
    from gguf import GGUFReader
    r = GGUFReader(path)

    def strings(name):
        f = r.fields[name]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    def scalar_str(name):
        f = r.fields.get(name)
        return bytes(f.parts[f.data[0]]).decode("utf-8") if f else None

    tokens = strings("tokenizer.ggml.tokens")
    merges = strings("tokenizer.ggml.merges")
    tf = r.fields.get("tokenizer.ggml.token_type")
    types = [int(tf.parts[i][0]) for i in tf.data] if tf else [1] * len(tokens)
    return tokens, merges, types, scalar_str("tokenizer.ggml.pre"), scalar_str("tokenizer.ggml.model")


def build_hf(tokens, merges, types, pre):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    vocab = {t: i for i, t in enumerate(tokens)}
    bpe = models.BPE(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges])
    tk = Tokenizer(bpe)
    bl = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in L3_PRES or pre in O200K_PRES:
        from tokenizers import Regex
        pattern = O200K_PATTERN if pre in O200K_PRES else L3_PATTERN % L3_PRES[pre]
        split = pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False)
        tk.pre_tokenizer = pre_tokenizers.Sequence(
            [split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    elif pre in DIGIT_PRES:
        tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), bl])
    else:
        tk.pre_tokenizer = bl
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False)
                           for t, ty in zip(tokens, types) if ty == 3 and t])
    tk.add_tokens([AddedToken(t, special=False, normalized=False)
                   for t, ty in zip(tokens, types) if ty == 4 and t])
    return tk




class Reference:
    def __init__(self, gguf_path):
        tokens, merges, types, pre, model = load_gguf_vocab(gguf_path)
        if model != "gpt2":
            sys.exit("tokenizer.ggml.model %r is not gpt2" % model)
        self.pre = pre
        self.tk = build_hf(tokens, merges, types, pre)
        self.specials = sorted([t for t, ty in zip(tokens, types) if ty in (3, 4) and t],
                               key=len, reverse=True)
        self.special_id = {t: i for i, t in enumerate(tokens) if types[i] in (3, 4)}
        self.b2u = bytes_to_unicode()

    n_direct = n_emulated = 0

    def encode(self, data):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            self.n_emulated += 1
            return self._encode_invalid(data)
        self.n_direct += 1
        return self.tk.encode(text, add_special_tokens=False).ids

    def _encode_invalid(self, data):
        # one str char per input char; undecodable bytes become U+DC80+b (one per byte)
        s = data.decode("utf-8", errors="surrogateescape")
        assert PLACEHOLDER not in s
        raw = [c.encode("utf-8") if not 0xDC80 <= ord(c) <= 0xDCFF else bytes([ord(c) - 0xDC00]) for c in s]
        masked = "".join(PLACEHOLDER if 0xDC80 <= ord(c) <= 0xDCFF else c for c in s)
        ids, i, start = [], 0, 0
        while i < len(masked):             # specials: leftmost, longest
            hit = next((t for t in self.specials if masked.startswith(t, i)), None)
            if hit is None:
                i += 1
                continue
            ids += self._segment(masked, raw, start, i)
            ids.append(self.special_id[hit])
            i += len(hit)
            start = i
        return ids + self._segment(masked, raw, start, len(masked))

    def _segment(self, masked, raw, a, b):
        if a >= b:
            return []
        out = []
        for _, (s, e) in self.tk.pre_tokenizer.pre_tokenize_str(masked[a:b]):
            word = "".join(self.b2u[x] for x in b"".join(raw[a + s:a + e]))
            out += [t.id for t in self.tk.model.tokenize(word)]
        return out


# ---------------------------------------------------------------- engine side
def engine_ids(args, files):
    if args.driver:
        res = subprocess.run([args.driver, args.gguf] + files, capture_output=True, text=True)
        if res.returncode != 0:
            sys.stderr.write(res.stderr)
        lines = res.stdout.splitlines()
        if len(lines) != len(files):
            sys.exit("driver printed %d lines for %d files" % (len(lines), len(files)))
        return [[int(x) for x in ln.split()] for ln in lines]
    out = []
    for f in files:
        res = subprocess.run([args.engine, "--model", args.gguf, "--tokenize", f], capture_output=True, text=True)
        if res.returncode != 0:
            sys.exit("engine failed on %s: %s" % (f, res.stderr.strip()))
        out.append([int(x) for x in res.stdout.split()])
    return out


def chunks(data, size):
    out, i = [], 0
    while i < len(data):
        j = data.find(b"\n", i + size)
        j = len(data) if j < 0 else j + 1
        out.append(data[i:j])
        i = j
    return out


def show_diff(ref, chunk, a, b):
    k = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))
    ta = [ref.tk.id_to_token(x) for x in a[max(0, k - 3):k + 5]]
    tb = [ref.tk.id_to_token(x) for x in b[max(0, k - 3):k + 5]]
    print("  first difference at token %d:\n    engine: %r\n    hf:     %r" % (k, ta, tb))


def check(args):
    ref = Reference(args.gguf)
    data = open(args.text, "rb").read()
    parts = chunks(data, args.chunk)
    with tempfile.TemporaryDirectory() as d:
        files = []
        for i, p in enumerate(parts):
            f = os.path.join(d, "c%05d.txt" % i)
            with open(f, "wb") as fh:
                fh.write(p)
            files.append(f)
        ours = engine_ids(args, files)
    n_ok = n_tok = n_tok_ok = 0
    bad = 0
    for p, mine in zip(parts, ours):
        theirs = ref.encode(p)
        n_tok += len(theirs)
        if mine == theirs:
            n_ok += 1
            n_tok_ok += len(theirs)
        else:
            bad += 1
            if bad <= args.show:
                print("MISMATCH in chunk starting %r" % p[:60])
                show_diff(ref, p, mine, theirs)
    print("pre=%s: %d/%d chunks identical (%d bytes, %d reference tokens, %d in identical chunks; "
          "%d chunks valid UTF-8 through HF encode, %d with invalid bytes through HF parts)"
          % (ref.pre, n_ok, len(parts), len(data), n_tok, n_tok_ok, ref.n_direct, ref.n_emulated))
    return 0 if n_ok == len(parts) else 1


# ---------------------------------------------------------------- corpus
SOUP = ["'", "s", "t", "re", "ve", "ll", "d", "m", "'S", " ", "  ", "\n", "\t", "\r", "1", "23", "a", "Z", "é",
        "\u0301", "!", ".", "<|im_end|>", "<|im_start|>", "<", "|", ">", "\u3000", "\u00a0", "\u2009", "中", "😀",
        "\u200d", "\ufe0f", "٣", "Ⅻ", "½", "\x00", "\x1f", "\x7f", "\u0085", "\u2028", "_", "-", "ß", "İ"]


def make_corpus(out, size, seed):
    rng = random.Random(seed)
    here = os.path.dirname(os.path.abspath(__file__))
    # real text from this machine: Python code and docs, C sources and headers, licences
    roots = [os.path.dirname(os.__file__), "/usr/include", "/usr/share/common-licenses",
             os.path.join(here, "..", "src"), "/usr/share/doc"]
    files = []
    for r in roots:
        for dp, _, fns in os.walk(r):
            for fn in fns:
                if fn.endswith((".py", ".c", ".h", ".txt", ".md", ".rst")) or "licen" in fn.lower() or r.endswith("licenses"):
                    files.append(os.path.join(dp, fn))
            if len(files) > 20000:
                break
    files.sort()
    rng.shuffle(files)
    # one C file of ours always: which files the shuffle picks depends on this machine's
    # trees (and on native/src's listing), and the corpus must hold C code whatever they are
    real = [open(os.path.join(here, "..", "src", "main.c"), "rb").read(6000)]
    for f in files:
        try:
            b = open(f, "rb").read(6000)
        except OSError:
            continue
        if b and b"\0" not in b:
            real.append(b)
        if sum(map(len, real)) > size * 0.55:
            break
    cjk = ("我们今天去公园散步，天气很好。東京都は日本の首都です。한국어 문장도 넣어 봅니다. "
           "人工智能（AI）正在改变世界！「引用」と『二重引用』。中文数字：一二三四五六七八九十百千万。")
    emoji = ["😀", "👍🏽", "👩‍💻", "🇫🇷", "❤️", "🤖", "🎉🎉", "1️⃣", "🏳️‍🌈", "✨", "🧪", "😂😂😂"]
    words = ("the quick brown fox jumps over lazy dog It's don't we'll they're I've you'd she'd "
             "I'M WE'LL café naïve résumé Ünïcödé straße ΑΒΓ αβγ Привет мир مرحبا שלום नमस्ते "
             "ﬁ ＡＢＣ１２３ Ⅻ ½ ² ³ ٣ ۴ ๕ x² e\u0301 n\u0303").split()
    seps = [" ", "  ", "   ", "\t", "\n", "\n\n", " \n", "\n ", "\r\n", "\u00a0", "\u3000", "\u2003",
            " \t ", "\n\n\n    ", "\u200b", "\u2028", "\x0b", "\x1c", ""]
    puncts = list(".,;:!?'\"()[]{}<>-_=+*/\\|@#$%^&~`") + ["...", "--", "->", "=>", "'s", "'ll", "''",
                                                            "<|im_end|>", "<|im_start|>", "<|im_", "<|endoftext|>",
                                                            "<filename>", "<jupyter_code>x", "<<|im_end|>>"]
    invalid = [b"\xff", b"\xfe\xfe", b"\xc3", b"\xe2\x82", b"\xf0\x9f\x98", b"\x80\x80", b"\xc0\xaf",
               b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe0\x80\xaf"]

    def number():
        k = rng.randrange(6)
        if k == 0:
            return str(rng.randrange(10 ** rng.randrange(1, 15)))
        if k == 1:
            return "%.*f" % (rng.randrange(1, 6), rng.uniform(-1e4, 1e4))
        if k == 2:
            return "%04d-%02d-%02d" % (rng.randrange(1900, 2100), rng.randrange(1, 13), rng.randrange(1, 29))
        if k == 3:
            return "0x%x" % rng.getrandbits(32)
        if k == 4:
            return "{:,}".format(rng.randrange(10 ** 9))
        return "v%d.%d.%d" % (rng.randrange(10), rng.randrange(30), rng.randrange(100))

    synth = []
    total_synth = size - sum(map(len, real))
    while sum(map(len, synth)) < total_synth:
        if rng.random() < 0.25:     # dense soup of the scanner's corner cases
            soup = "".join(rng.choice(SOUP) for _ in range(rng.randrange(20, 400))).encode()
            if rng.random() < 0.2:
                soup += rng.choice(invalid) + soup[:rng.randrange(1, 40)]
            synth.append(soup + b"\n")
            continue
        bad_ok = rng.random() < 0.2
        parts = []
        for _ in range(rng.randrange(20, 200)):
            k = rng.random()
            if k < 0.35:
                parts.append(rng.choice(words).encode())
            elif k < 0.45:
                parts.append(number().encode())
            elif k < 0.55:
                a = rng.randrange(len(cjk))
                parts.append(cjk[a:a + rng.randrange(1, 20)].encode())
            elif k < 0.62:
                parts.append(rng.choice(emoji).encode())
            elif k < 0.75:
                parts.append(rng.choice(puncts).encode())
            elif k < 0.78:
                if bad_ok:
                    parts.append(rng.choice(invalid))
            elif k < 0.80:
                parts.append(chr(rng.choice([rng.randrange(0x20, 0x7f), rng.randrange(0xa0, 0x3000),
                                             rng.randrange(0x3000, 0xd800), rng.randrange(0xe000, 0x10000),
                                             rng.randrange(0x10000, 0x30000)])).encode("utf-8", "replace"))
            parts.append(rng.choice(seps).encode() if rng.random() < 0.8 else b"")
        synth.append(b"".join(parts) + b"\n")
    blob = real + synth
    rng.shuffle(blob)
    with open(out, "wb") as f:
        for b in blob:
            f.write(b if b.endswith(b"\n") else b + b"\n")
    print("wrote %s (%d bytes)" % (out, os.path.getsize(out)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf", nargs="?")
    ap.add_argument("text", nargs="?")
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--engine", default=os.path.join(here, "..", "build", "colibri-engine"),
                    help="colibri-engine binary (called as ENGINE --model GGUF --tokenize FILE)")
    ap.add_argument("--driver", help="tok_ids binary (called once: DRIVER GGUF FILE...); preferred if given")
    ap.add_argument("--chunk", type=int, default=4096, help="approximate chunk size in bytes")
    ap.add_argument("--show", type=int, default=10, help="mismatches to print")
    ap.add_argument("--make-corpus", metavar="OUT")
    ap.add_argument("--size", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    if args.make_corpus:
        make_corpus(args.make_corpus, args.size, args.seed)
        return 0
    if not args.gguf or not args.text:
        ap.error("MODEL.gguf and TEXT_FILE are required")
    return check(args)


if __name__ == "__main__":
    sys.exit(main())
