"""Drafters: what proposes tokens for the target to verify.

Any language model (`spec_decode.core.protocol`) drafts through `ModelDrafter`;
the others implement the drafter protocol (`spec_decode.core.drafter`)
directly. This package holds drafters only (the feature draft and early exit
are built from a target's own layers, so they import `spec_decode.models`);
the benchmark's controlled-acceptance draft is `spec_decode.bench.controlled`.
Pass any of them as `draft=` to `spec_decode.generate`.

  ngram.py         an order-n n-gram table (the paper's unigram / bigram)
  copy.py          prompt lookup: what followed an earlier match of the suffix
  heads.py         Medusa / blockwise-parallel heads on the target's features
  feature.py       an EAGLE-style feature draft: T5 decoder layers over the
                   target's features and encoder keys/values
  feature_t5gemma.py  the same with T5Gemma layers, for a T5Gemma target
  early_exit.py    the target's first k decoder layers as its own draft
  early_exit_t5gemma.py  the same for a T5Gemma target (its ring cache)
  on_target.py     what those four share across model families: the
                   drafting loops, each family's layers behind a few methods
  hierarchical.py  a draft model sped up by a draft of its own
"""

from spec_decode.core.drafter import DraftContext
from spec_decode.core.drafter import Drafter
from spec_decode.core.drafter import Proposal
from spec_decode.core.model_drafter import ModelDrafter
from spec_decode.drafters.copy import Copy
from spec_decode.drafters.early_exit import EarlyExit
from spec_decode.drafters.feature import FeatureDraft
from spec_decode.drafters.heads import Heads
from spec_decode.drafters.hierarchical import Hierarchical
from spec_decode.drafters.ngram import NGram

__all__ = [
  'Copy',
  'DraftContext',
  'Drafter',
  'EarlyExit',
  'FeatureDraft',
  'Heads',
  'Hierarchical',
  'ModelDrafter',
  'NGram',
  'Proposal',
]
