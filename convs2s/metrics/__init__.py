"""How outputs are scored: `scoring` (sacreBLEU, Moses-tokenized BLEU, chrF, ROUGE, Romanian
normalization) and `task_kinds` (which metrics each kind of task reports: translation or
summarization, and the main one). A new metric goes in `scoring` and in its task kind's list.

May import: the standard library, sacrebleu, sacremoses, rouge-score. No torch.
"""
