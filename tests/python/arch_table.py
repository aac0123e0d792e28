"""The committed crates/devmap-core/src/model/arch_table.txt, crates/devmap-core/src/model/expect_table.txt and
crates/devmap-core/src/model/buffer_table.txt against the installed transformers: for the architectures
of the planner's acceptance test (and a few more), the block each generator writes now
must be the block committed (regenerate with scripts/gen_arch_table.py,
scripts/gen_expect_table.py and scripts/gen_buffer_table.py after an upgrade). The
whole tables take minutes to generate; these take seconds.

Usage: python arch_table.py PATH/TO/devmap   (devmap is not needed; kept for symmetry)
"""

import os
import sys

import transformers

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))
from gen_arch_table import describe, render_block  # noqa: E402
import gen_buffer_table  # noqa: E402
import gen_expect_table  # noqa: E402

CHECKED = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "MistralForCausalLM": "mistral",
    "GemmaForCausalLM": "gemma",
    "PhiForCausalLM": "phi",
    "GPT2LMHeadModel": "gpt2",
    "GPTNeoXForCausalLM": "gpt_neox",
    "OPTForCausalLM": "opt",
    "BertForMaskedLM": "bert",
    "T5ForConditionalGeneration": "t5",
    "MixtralForCausalLM": "mixtral",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "LlavaForConditionalGeneration": "llava",
    "Gemma3ForConditionalGeneration": "gemma3",
}


def committed_blocks(path):
    """{architecture: block text} as the file has them."""
    blocks, names, lines = {}, None, []
    with open(path) as f:
        for line in f.read().splitlines():
            if line.startswith("#"):
                continue
            if line.startswith("= "):
                if names:
                    for n in names:
                        blocks[n] = "\n".join(lines)
                names, lines = line[2:].split(" "), []
            else:
                lines.append(line)
    for n in names or []:
        blocks[n] = "\n".join(lines)
    return blocks


def main():
    path = os.path.join(os.path.dirname(__file__), "..", "..", "crates", "devmap-core", "src", "model", "arch_table.txt")
    with open(path) as f:
        header = f.readline().strip("# \n")
    blocks = committed_blocks(path)
    stale = []
    for arch, model_type in CHECKED.items():
        fresh = render_block(*describe(getattr(transformers, arch), model_type))
        if blocks.get(arch) != fresh:
            stale.append(arch)
    if stale:
        raise SystemExit(
            f"crates/devmap-core/src/model/arch_table.txt ({header}) differs from this transformers "
            f"({transformers.__version__}) for {stale}: run scripts/gen_arch_table.py")
    print(f"ok: {len(CHECKED)} architectures as committed, of {len(blocks)} in the table")
    # A few of the fitted tables' blocks: each takes a fit of its own (a class
    # instantiated once per config integer).
    check_fitted(path, "expect_table.txt", gen_expect_table, "expected tensors",
                 ("LlamaForCausalLM", "GPT2LMHeadModel", "T5ForConditionalGeneration",
                  "MixtralForCausalLM", "LlavaForConditionalGeneration", "BertForMaskedLM"))
    check_fitted(path, "buffer_table.txt", gen_buffer_table, "buffers",
                 ("LlamaForCausalLM", "Qwen2ForCausalLM", "GemmaForCausalLM", "BertForMaskedLM",
                  "LlavaForConditionalGeneration"))


def check_fitted(arch_path, table, generator, what, archs):
    """The committed `table` (beside the arch table) against its `generator`'s
    `describe` for `archs`, each with its model type from CHECKED."""
    committed = committed_blocks(os.path.join(os.path.dirname(arch_path), table))
    stale = [arch for arch in archs
             if committed.get(arch) != generator.describe(getattr(transformers, arch), CHECKED[arch])]
    if stale:
        raise SystemExit(
            f"crates/devmap-core/src/model/{table} differs from this transformers ({transformers.__version__}) "
            f"for {stale}: run scripts/{generator.__name__}.py")
    print(f"ok: {len(archs)} architectures' {what} as committed, of {len(committed)} in the table")

if __name__ == "__main__":
    main()
