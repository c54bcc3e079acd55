"""How each model ranks the tokens beam search keeps (`bench beam`).

Speculative beam search replays a step only when every new live beam is a
node of its parent's draft tree, and a tree gives each node the draft's c
best non-EOS children. So its steps per call are bounded by how often all
K new live beams' tokens rank among the c best under the draft. This
measures it along plain beam search's own path: for every step s >= 2 of
every row (step 1 extends the single start beam) and every live beam, the
rank of the beam's newest token among its parent's non-EOS next tokens
under the target and under the draft (both teacher-forced on the beam's
sequence); `covered` at c is the fraction of steps whose K live beams all
rank below c. Under the target, c = K always covers (a live beam is among
the K best non-EOS extensions of all beams, so among its parent's K best):
the target's row is the ceiling a perfect draft would reach; the draft's
row is what the tree can use.
"""

from typing import Any

import jax.numpy as jnp
import numpy as np

import spec_decode as sd


def _ranks(model: Any, enc: np.ndarray, seqs: np.ndarray) -> np.ndarray:
  """Rank `[N, M]` of token t + 1 among the non-EOS tokens after inputs
  0..t, for sequences `seqs [N, M + 1]` of one encoder input `enc [S]`."""
  n, length = seqs.shape
  state = model.init_state(jnp.asarray(np.repeat(enc[None], n, 0)), length)
  logits, _ = model.score(state, jnp.asarray(seqs))
  logits = logits[:, :-1].astype(jnp.float32)
  logits = logits.at[..., sd.EOS_ID].set(-jnp.inf)
  chosen = jnp.take_along_axis(logits, jnp.asarray(seqs[:, 1:, None]), 2)
  return np.asarray(jnp.sum(logits > chosen, axis=2))


def step_ranks(
  model: Any, enc: np.ndarray, seqs: np.ndarray, live: np.ndarray, steps
) -> np.ndarray:
  """The largest rank over the live beams, for every row's steps s >= 2.

  Args:
    model: the model that ranks.
    enc: `[B, S]` encoder tokens.
    seqs: `[B, M + 1, K, M + 1]` the live sequences after each step (as
      `bench.beam.controlled.live_sequences` records them).
    live: `[B, M + 1, K]` which of them are real beams.
    steps: `[B]` the steps each row took.

  Returns:
    `[sum over rows of (steps - 1)]` ranks (-1: no real live beam).
  """
  worst = []
  m = seqs.shape[1] - 1
  for b in range(enc.shape[0]):
    s_max = int(steps[b])
    if s_max < 2:
      continue
    # Every step 2..M (one shape, one compile); steps past s_max dropped.
    rows = seqs[b, 2:].reshape(-1, seqs.shape[-1])
    ranks = _ranks(model, enc[b], rows).reshape(m - 1, seqs.shape[2], -1)
    s = np.arange(2, m + 1)
    newest = ranks[np.arange(m - 1), :, s - 1]  # Token s: [M - 1, K].
    newest = np.where(live[b, 2:], newest, -1)
    worst.append(newest.max(1)[: s_max - 1])
  return np.concatenate(worst) if worst else np.zeros((0,), np.int64)


def coverage_rows(
  target: Any,
  draft: Any,
  enc: np.ndarray,
  recorded: tuple[np.ndarray, np.ndarray, np.ndarray],
  children: tuple[int, ...] = (1, 2, 3, 4, 6, 8),
) -> list[dict[str, Any]]:
  """`covered` at each c, ranked by the target and by the draft.

  Args:
    target: the target (its beam search was recorded).
    draft: the draft.
    enc: `[B, S]` encoder tokens.
    recorded: `(seqs, live, steps)` of the target's plain beam search
      (`step_ranks`).
    children: the c values.

  Returns:
    Rows `{model, num_beams, children, covered, steps}`.
  """
  seqs, live, steps = recorded
  rows = []
  for name, model in (('target', target), ('draft', draft)):
    worst = step_ranks(model, enc, seqs, live, steps)
    for c in children:
      rows.append(
        {
          'model': name,
          'num_beams': int(seqs.shape[2]),
          'children': c,
          'covered': float(np.mean(worst < c)) if len(worst) else 1.0,
          'steps': int(len(worst)),
        }
      )
  return rows


def markdown(rows: list[dict[str, Any]]) -> str:
  """One line per (K, model): covered at each c."""
  cs = sorted({r['children'] for r in rows})
  lines = [
    '| beams | ranked by | steps | ' + ' | '.join(f'c={c}' for c in cs) + ' |',
    '|---|---|---|' + '---|' * len(cs),
  ]
  for k, name in dict.fromkeys((r['num_beams'], r['model']) for r in rows):
    mine = {
      r['children']: r
      for r in rows
      if (r['num_beams'], r['model']) == (k, name)
    }
    steps = next(iter(mine.values()))['steps']
    cells = ' | '.join(f'{mine[c]["covered"]:.2f}' for c in cs)
    lines.append(f'| {k} | {name} | {steps} | {cells} |')
  return '\n'.join(lines)
