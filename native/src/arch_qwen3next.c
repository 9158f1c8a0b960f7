/* arch_qwen3next.c — llama.cpp's `qwen3next` (Qwen3-Next-80B-A3B): the sibling of qwen35moe, the
 * same Gated DeltaNet / gated full-attention hybrid (gdn.c: its layers, forward, MTP block and
 * per-slot recurrent state) with llama.cpp's qwen3next graph's differences:
 *   - full attention: plain NeoX RoPE on rope.dimension_count dims (partial rotary), no M-RoPE
 *     sections (a file with them is refused as an unknown key);
 *   - the DeltaNet's input: attn_qkv + attn_gate (what the converter writes) or the legacy fused
 *     ssm_in, per q/k head [q | k | v | z]; beta and alpha from one ssm_ba, per q/k head
 *     [beta | alpha] (gdn.c spreads both into the unfused layout);
 *   - the v heads grouped: v head h reads q/k head h / (Hv / Hk) (ggml's repeat-interleave);
 *   - every block has the shared expert (llama.cpp's loader requires it) and the MoE: the
 *     graph's dense-FFN branch is unreachable from its loader, so a block without ffn_gate_inp is
 *     refused naming it.
 * The MTP block is a trunk full-attention block plus nextn.*, as qwen35moe's. */
#include "arch.h"

static const hybrid_variant qwen3next = {.v_grouped = 1, .fused_in = 1, .shexp_required = 1};

static int qwen3next_block(model *m, int l, expert_layer_src *src, char *err, size_t errlen) {
    return hybrid_block(m, l, src, &qwen3next, err, errlen);
}

static int qwen3next_forward(fwd *F) { return hybrid_forward(F, &qwen3next); }

const arch_ops arch_qwen3next = {.name = "qwen3next", .hparams = hybrid_hparams, .block = qwen3next_block,
                                 .forward = qwen3next_forward, .mtp_block = hybrid_mtp_block,
                                 .mtp_forward = hybrid_mtp_forward};
