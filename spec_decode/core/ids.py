"""Token ids the decoding loops rely on (T5's conventions)."""

PAD_ID = 0  # Also the decoder start token, as in T5.
EOS_ID = 1
UNK_ID = 2
