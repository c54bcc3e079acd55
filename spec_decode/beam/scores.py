"""How close speculative beam search's scores are to plain's, and why.

Speculative beam search returns plain beam search's beams and lengths; its
scores agree up to float32 rounding. A beam's score is its length-
normalised sum of per-token float32 log-probs, log p = z - logsumexp(z).
Plain search takes each from a one-token target call, speculative search
from a tree-scoring call over several tokens; the two calls reduce (matrix
products, RMSNorm, softmax) in other orders, so each log-prob differs by a
few float32 ulp of the logits' magnitude, and a score by at most the sum
over its tokens, divided by the length penalty. The difference therefore
grows with the length and the logits' scale, not with the score: an
absolute tolerance alone fails on long outputs (an outside check saw
1.53e-5 on the demo pair), a relative one holds while the logits stay
within a few units of the log-probs, as in every model we decode.

Measured on the demo pair (30 Debian EnDe inputs, 4 beams, alpha 0.6,
max_decode_len 64, gamma 2 and 4): at most 3.6e-7 relative (3 ulp; 3.8e-5
absolute at a score of -122.7, 64 tokens); gamma='auto' took plain steps
and matched exactly. The tolerance below is 1e-5 relative (84 ulp), plus
1e-5 absolute for scores near zero: the eval's exact-match check
(`eval.decoding.same_output`) and the tests use it.
"""

import numpy as np

RTOL = 1e-5
ATOL = 1e-5


def agree(a, b) -> bool:
  """Whether two score arrays agree within the stated tolerance."""
  return bool(np.allclose(a, b, rtol=RTOL, atol=ATOL))
