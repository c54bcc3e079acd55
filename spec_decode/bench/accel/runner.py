"""The accelerator bench's items, run in order, each only where it fits.

An `Item` predicts its own seconds (compilation included) before it runs;
the runner skips it, recording why, when the prediction exceeds what its
box has left, when `--only`/`--skip` leave it out, or when an item it needs
was not measured (`Skip`). Sections named in `boxes` share what the core
(every section not named there) leaves; the core runs against the whole
budget. Every item is written as running before it starts and as an event
(seconds, predicted) after, so a killed run says where it stopped.
"""

import dataclasses
import time
from collections.abc import Callable
from collections.abc import Sequence

from spec_decode.bench.accel.plan import Deadline
from spec_decode.bench.accel.record import Recorder


class Skip(Exception):  # noqa: N818  A reason, not an error.
  """Raised by an item that cannot run (its reason is recorded)."""


@dataclasses.dataclass(frozen=True)
class Item:
  """One measurement.

  Attributes:
    section: the section (`--only`/`--skip` name it, or `section/name`).
    name: the item within its section.
    predict: () -> predicted seconds, compilation included; called just
      before the item would run, so it reads what earlier items measured.
    run: (box) -> None; records its results itself, may raise `Skip`.
  """

  section: str
  name: str
  predict: Callable[[], float]
  run: Callable[[Deadline], None]

  @property
  def key(self) -> str:
    return f'{self.section}/{self.name}'


def selected(item: Item, only: Sequence[str], skip: Sequence[str]) -> bool:
  """Whether `--only` (empty: all) and `--skip` keep `item`."""
  names = (item.section, item.key)
  if only and not any(n in only for n in names):
    return False
  return not any(n in skip for n in names)


class Runner:
  """Runs items in order within `budget` seconds (see the module doc)."""

  def __init__(self, rec: Recorder, budget: float, boxes: dict[str, float]):
    self.rec = rec
    self.total = Deadline(budget)
    self.boxes = boxes
    self._box: tuple[str, Deadline] | None = None
    self.fatal: BaseException | None = None

  def _section_box(self, section: str, pending: Sequence[str]) -> Deadline:
    if section not in self.boxes:
      return self.total
    if self._box is None or self._box[0] != section:
      later = [s for s in dict.fromkeys(pending) if s in self.boxes]
      share = self.boxes[section] / sum(self.boxes[s] for s in later)
      self._box = (section, self.total.box(self.total.left() * share))
    return self._box[1]

  def run(
    self,
    items: Sequence[Item],
    only: Sequence[str] = (),
    skip: Sequence[str] = (),
    fatal_sections: Sequence[str] = (),
  ) -> None:
    """Runs `items`; an error in a `fatal_sections` item stops the run."""
    items = list(items)
    chosen = [i for i in items if selected(i, only, skip)]
    for item in items:
      if item not in chosen:
        self.rec.skip(item.section, item.name, 'not selected (--only/--skip)')
    for n, item in enumerate(chosen):
      box = self._section_box(item.section, [i.section for i in chosen[n:]])
      try:
        predicted = float(item.predict())
      except Skip as e:
        self.rec.skip(item.section, item.name, str(e))
        continue
      except Exception as e:  # noqa: BLE001  A broken prediction is the
        # item's error, never the run's end.
        self.rec.error(item.section, e)
        continue
      if not box.fits(predicted):
        self.rec.skip(
          item.section,
          item.name,
          f'predicted {predicted:.0f} s > {box.left():.0f} s left in its box',
        )
        continue
      print(
        f'accel: {item.key} (predicted {predicted:.1f} s, '
        f'{box.left():.0f} s left)',
        flush=True,
      )
      self.rec.begin(item.section, item.name, predicted)
      t0 = time.perf_counter()
      try:
        item.run(box)
      except Skip as e:  # Found out on running: a skip, not a measurement.
        self.rec.skip(item.section, item.name, str(e))
        continue
      except Exception as e:  # noqa: BLE001  Recorded; later items go on.
        self.rec.error(item.section, e)
        print(f'accel: {item.key} failed: {e}', flush=True)
        if item.section in fatal_sections:
          self.fatal = e
          self.rec.event(
            item.section, item.name, time.perf_counter() - t0, predicted
          )
          return
      self.rec.event(
        item.section, item.name, time.perf_counter() - t0, predicted
      )
