"""Where this project departs from the original's public API, and why.

DEPARTURES maps "module.name" to the reason (TF1-only names that cannot mean
anything on TF2, ...); each is also listed in CONTRIBUTING.md. PENDING holds
names still being brought in line: it must shrink to nothing.
"""

_T2T = ("the original's t2t_vocabulary wraps tensor2tensor's text encoders; "
        "tensor2tensor does not install on current TensorFlow (use "
        "ByteVocabulary, or a SentencePiece or WordPiece vocabulary)")
DEPARTURES = {
    "mesh_tensorflow.transformer.t2t_vocabulary.T2tVocabulary": _T2T,
    "mesh_tensorflow.transformer.t2t_vocabulary.get_t2t_vocabulary": _T2T,
}

PENDING = frozenset([
])
