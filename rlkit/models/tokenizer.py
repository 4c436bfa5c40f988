"""Character-level tokenizer for the built-in task, built with the `tokenizers` library."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)


def build_char_tokenizer(alphabet: str) -> PreTrainedTokenizerFast:
    """One token per character of `alphabet`, after the specials (ids 0-3: pad, bos, eos, unk).

    Encoding prepends ``<bos>`` (``add_special_tokens=False`` leaves it out, e.g. for completion
    text); callers append EOS to training targets. Padding is on the left, as batched generation
    needs. Saves and loads with `save_pretrained` /
    `AutoTokenizer.from_pretrained`.
    """
    characters = list(dict.fromkeys(alphabet))
    if not characters:
        raise ValueError("alphabet must contain at least one character")
    vocab = {token: index for index, token in enumerate((*SPECIAL_TOKENS, *characters))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    core.decoder = decoders.Fuse()
    core.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        padding_side="left",
    )
