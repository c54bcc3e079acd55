"""`spec-decode bench infer`'s measurement on tiny random models: both
sides run, compiled first, their predictions equal (the figures
themselves are the bench's, not a test's)."""

from spec_decode.bench import infer as bench_infer
from spec_decode.eval import run as eval_lib
from spec_decode.eval.infer import run as infer_lib

TASK = 'synthetic_tiny'


def test_measure_runs_both_sides_and_compares_their_predictions(monkeypatch):
  monkeypatch.setattr(bench_infer, 'TASK', TASK)
  vocab = eval_lib.task_vocabulary(TASK, vocab_size=64)
  tiny = 'models/t5_1_1/tiny.gin'
  target = eval_lib.load_model(model_gin=tiny, seed=0, vocabulary=vocab)
  settings = infer_lib.InferSettings(
    task=TASK, num_examples=3, batch_size=1, gamma=2, max_decode_len=6
  )
  # The target as its own draft: every draft token accepted.
  out = bench_infer.measure(target, target, settings, rounds=2)
  assert out['examples'] == 3 and out['identical_predictions']
  assert len(out['speedup_rounds']) == 2 and out['speedup'] > 0
  assert out['alpha'] == 1.0 and out['tokens_per_call'] > 1
  assert out['plain_examples_per_second'] > 0
