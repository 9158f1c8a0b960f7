#!/usr/bin/env python3
"""llama_vocab_check.py — what llama.cpp's vocabulary loader makes of a GGUF's special tokens,
beside what the engine makes of them: end of generation, control (no text in replies) or shown,
and the ids of a prompt with the specials in it.

    llama_vocab_check.py MODEL.gguf [--llama-python /work/llcpp-venv/bin/python]
                                    [--engine-driver native/build/tok_ids] [--text FILE]

llama.cpp (llama-cpp-python built from source) loads, with vocab_only, a copy of the file's
tokenizer.* keys under a minimal llama-architecture header (its loader reads the hyper-parameters
even then; the token rules do not depend on them). The engine side is tok_ids --specials. Exit status 0 when both agree on every special token and
on the prompt's ids, 1 otherwise. --text FILE also counts the chunks of FILE (cut as
check_tokenizer.py cuts them) whose ids differ between the two; that count is reported, not
judged: HF tokenizers is the engine's contract, and llama.cpp's std::regex form of some
patterns (o200k's case classes) is an approximation of it.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

PROMPT = ("<|start|>user<|message|>What's 2+2?<|end|><|start|>assistant<|channel|>analysis<|message|>"
          "Easy.<|end|><|start|>assistant<|channel|>final<|message|>4<|return|>")

LLAMA_SCRIPT = r"""
import ctypes, json, sys
import llama_cpp as L
L.llama_backend_init()
p = L.llama_model_default_params()
p.vocab_only = True
m = L.llama_model_load_from_file(sys.argv[1].encode(), p)
assert m, "llama.cpp could not load " + sys.argv[1]
v = L.llama_model_get_vocab(m)
n = L.llama_vocab_n_tokens(v)
out = {"n": n, "special": {}}
CONTROL, USER = 8, 16     # llama_token_attr bits
for i in range(n):
    a = L.llama_vocab_get_attr(v, i)
    if a & (CONTROL | USER):
        buf = ctypes.create_string_buffer(256)
        k = L.llama_token_to_piece(v, i, buf, 256, 0, False)
        out["special"][i] = {"eog": bool(L.llama_vocab_is_eog(v, i)), "control": bool(a & CONTROL),
                             "shown": buf.raw[:max(k, 0)].decode("utf-8", "replace")}
text = sys.argv[2].encode()
ids = (L.llama_token * (len(text) + 8))()
k = L.llama_tokenize(v, text, len(text), ids, len(text) + 8, False, True)
out["prompt"] = list(ids[:k])
out["chunks"] = []
for path in sys.argv[3:]:
    text = open(path, "rb").read()
    ids = (L.llama_token * (len(text) + 8))()
    k = L.llama_tokenize(v, text, len(text), ids, len(text) + 8, False, True)
    out["chunks"].append(list(ids[:k]))
print(json.dumps(out))
"""


def vocab_only_copy(src: str, dst: str) -> None:
    from gguf import GGUFReader, GGUFValueType, GGUFWriter
    r = GGUFReader(src)
    w = GGUFWriter(dst, "llama")
    w.add_context_length(256)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(4)
    w.add_layer_norm_rms_eps(1e-5)
    for field in r.fields.values():
        if field.name.startswith("tokenizer."):
            vtype = GGUFValueType(field.types[0])
            sub = GGUFValueType(field.types[-1]) if vtype == GGUFValueType.ARRAY else None
            w.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf")
    ap.add_argument("--llama-python", default="/work/llcpp-venv/bin/python")
    ap.add_argument("--engine-driver", default=os.path.join(HERE, "..", "build", "tok_ids"))
    ap.add_argument("--text", help="a text file whose chunks both tokenize (ids compared, counted)")
    args = ap.parse_args(argv)
    import tempfile
    tmp = tempfile.mkdtemp()
    copy = os.path.join(tmp, "vocab.gguf")
    vocab_only_copy(args.gguf, copy)
    files = []
    if args.text:
        sys.path.insert(0, HERE)
        from check_tokenizer import chunks
        for i, part in enumerate(chunks(open(args.text, "rb").read(), 4096)):
            try:
                part.decode("utf-8")
            except UnicodeDecodeError:    # llama.cpp aborts on invalid UTF-8: left out
                continue
            files.append(os.path.join(tmp, "c%05d.txt" % i))
            with open(files[-1], "wb") as fh:
                fh.write(part)
    res = subprocess.run([args.llama_python, "-c", LLAMA_SCRIPT, copy, PROMPT, *files], capture_output=True,
                         text=True)
    if res.returncode != 0:
        sys.exit("llama.cpp side failed:\n" + res.stderr[-2000:])
    ll = json.loads(res.stdout.strip().splitlines()[-1])
    res = subprocess.run([args.engine_driver, "--specials", args.gguf], capture_output=True, text=True, check=True)
    ours = {int(f[0]): {"eog": f[1] == "1", "control": f[2] == "1", "shown": f[3] if len(f) > 3 else ""}
            for f in (ln.split(" ", 3) for ln in res.stdout.splitlines())}
    with open(os.path.join(tmp, "prompt.txt"), "w") as f:
        f.write(PROMPT)
    res = subprocess.run([args.engine_driver, args.gguf, f.name], capture_output=True, text=True, check=True)
    our_prompt = [int(x) for x in res.stdout.split()]
    bad = 0
    for i in sorted(set(ours) | {int(k) for k in ll["special"]}):
        a, b = ours.get(i), ll["special"].get(str(i))
        same = a == b
        bad += not same
        print("%6d %-22s engine %-40s llama.cpp %s%s" % (i, (a or b or {}).get("shown", "")[:22], a, b,
                                                         "" if same else "   <-- differs"))
    print("prompt ids identical: %s (%d tokens)" % (our_prompt == ll["prompt"], len(our_prompt)))
    bad += our_prompt != ll["prompt"]
    if files:
        res = subprocess.run([args.engine_driver, args.gguf, *files], capture_output=True, text=True)
        mine = [[int(x) for x in ln.split()] for ln in res.stdout.splitlines()]
        same = sum(a == b for a, b in zip(mine, ll["chunks"]))
        print("text chunks with identical ids: %d/%d (%d engine tokens, %d llama.cpp tokens)"
              % (same, len(files), sum(map(len, mine)), sum(map(len, ll["chunks"]))))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
