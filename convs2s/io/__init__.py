"""What is read and written besides the run's data: `checkpoint` (the checkpoint format, loaded
with an allowlist of plain types, never pickled code; best / latest / picking), `averaging`
(checkpoint averaging and slim copies), `text_codec` (the text pipeline a checkpoint carries:
sentencepiece or the reference's Moses + subword-nmt BPE) and `fairseq` (import / export of the
reference implementation's checkpoints and dictionaries).

May import: torch, sentencepiece, sacremoses, subword-nmt, `convs2s.config`, `convs2s.model`.
A new storage backend changes `checkpoint`'s reads and writes, nothing above them.
"""
