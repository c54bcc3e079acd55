"""Text-quality metrics of the eval runs, computed as T5 computes them.

* `bleu`: sacrebleu corpus BLEU with T5's settings (`t5.evaluation.metrics.
  bleu`): exponential smoothing, international tokenization, no lowercasing,
  one reference per example. Returns `{'bleu': score}` on a 0-100 scale.
* `rouge`: rouge-score F-measures of ROUGE-1, ROUGE-2 and ROUGE-L with the
  Porter stemmer, averaged over examples. Returns `{'rouge1', 'rouge2',
  'rougeL'}` on a 0-100 scale. (T5 reports bootstrap-aggregated means, which
  agree with the plain mean up to resampling noise.)

Both libraries come with the `metrics` extra (`pip install -e .[metrics]`);
they are imported when a metric is computed, so this module always imports.
"""

import importlib
from collections.abc import Callable
from collections.abc import Sequence

ROUGE_TYPES = ('rouge1', 'rouge2', 'rougeL')


def _require(module: str):
  try:
    return importlib.import_module(module)
  except ImportError as e:
    raise ImportError(
      f'`{module}` is needed for this metric: pip install -e ".[metrics]"'
    ) from e


def _check(predictions: Sequence[str], references: Sequence[str]) -> None:
  if len(predictions) != len(references):
    raise ValueError(
      f'{len(predictions)} predictions but {len(references)} references'
    )


def bleu(
  predictions: Sequence[str], references: Sequence[str]
) -> dict[str, float]:
  """Corpus BLEU (sacrebleu, T5's settings).

  Args:
    predictions: one detokenized hypothesis per example.
    references: one reference per example.

  Returns:
    `{'bleu': score}`, 0-100; 0.0 for an empty corpus.
  """
  _check(predictions, references)
  if not predictions:
    return {'bleu': 0.0}
  sacrebleu = _require('sacrebleu')
  score = sacrebleu.corpus_bleu(
    list(predictions),
    [list(references)],
    smooth_method='exp',
    smooth_value=0.0,
    force=False,
    lowercase=False,
    tokenize='intl',
    use_effective_order=False,
  )
  return {'bleu': float(score.score)}


def rouge(
  predictions: Sequence[str], references: Sequence[str]
) -> dict[str, float]:
  """Mean ROUGE-1/2/L F-measures with stemming (rouge-score).

  Args:
    predictions: one summary per example.
    references: one reference summary per example.

  Returns:
    `{'rouge1': f, 'rouge2': f, 'rougeL': f}`, each 0-100; zeros for an empty
    corpus.
  """
  _check(predictions, references)
  if not predictions:
    return dict.fromkeys(ROUGE_TYPES, 0.0)
  rouge_scorer = _require('rouge_score.rouge_scorer')
  scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True)
  totals = dict.fromkeys(ROUGE_TYPES, 0.0)
  for prediction, reference in zip(predictions, references, strict=True):
    scores = scorer.score(reference, prediction)  # (target, prediction).
    for name in ROUGE_TYPES:
      totals[name] += scores[name].fmeasure
  n = len(predictions)
  return {name: 100.0 * total / n for name, total in totals.items()}


METRICS: dict[str, Callable[[Sequence[str], Sequence[str]], dict]] = {
  'bleu': bleu,
  'rouge': rouge,
}


def compute(
  metric_name: str, predictions: Sequence[str], references: Sequence[str]
) -> dict[str, float]:
  """Computes a metric by name (`bleu` or `rouge`).

  Args:
    metric_name: a key of `METRICS`.
    predictions: one output text per example.
    references: one reference text per example.

  Returns:
    The metric's dict of scores, each on a 0-100 scale.
  """
  if metric_name not in METRICS:
    raise ValueError(
      f'Unknown metric {metric_name!r}; known: {sorted(METRICS)}'
    )
  return METRICS[metric_name](predictions, references)
