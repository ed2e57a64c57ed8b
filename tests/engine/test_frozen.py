"""engine.frozen.fast_init: the same instances as the dataclass's own ``__init__`` (fields,
defaults, positional and keyword arguments, ``__post_init__``, equality, hash, frozen), and a
refusal for the classes it does not handle."""

import dataclasses
import inspect

import pytest

from engine.frozen import fast_init
from engine.outputs import ScheduledRequest, SchedulerOutput, StepStats
from kvplan.results.records import RequestRecord, StepRecord
from kvplan.run.driver import Finished, Submission
from kvplan.run.sim.cost import StepWork


def twins():
    """A class with every kind of field fast_init takes, with and without fast_init."""

    def make():
        @dataclasses.dataclass(frozen=True)
        class Point:
            x: int
            y: float = 0.5
            tags: tuple[str, ...] = ()
            label: str | None = None
            total: float = dataclasses.field(init=False)

            def __post_init__(self):
                object.__setattr__(self, "total", self.x + self.y)

        return Point

    return make(), fast_init(make())


@pytest.mark.parametrize(
    "args,kwargs", [((1,), {}), ((1, 2.5), {}), ((3,), {"label": "a", "tags": ("t",)}), ((), {"x": 4, "y": -1.0})]
)
def test_the_same_instance_as_the_dataclass_init(args, kwargs):
    plain, fast = twins()
    a, b = plain(*args, **kwargs), fast(*args, **kwargs)
    assert a.__dict__ == b.__dict__ and list(a.__dict__) == list(b.__dict__)  # same fields, same order
    assert hash(dataclasses.astuple(a)) == hash(dataclasses.astuple(b))
    assert repr(a).split("Point(")[1] == repr(b).split("Point(")[1]
    assert b == fast(*args, **kwargs) and hash(b) == hash(fast(*args, **kwargs))
    with pytest.raises(dataclasses.FrozenInstanceError):
        b.x = 9
    with pytest.raises(TypeError):
        fast()  # x has no default, as before
    with pytest.raises(TypeError):
        fast(1, z=2)


@pytest.mark.parametrize("cls", [StepStats, SchedulerOutput, RequestRecord, StepRecord, Submission, Finished, StepWork])
def test_the_classes_built_each_step_keep_their_signature(cls):
    """Each decorated class takes its init fields in order with their defaults, as the dataclass
    generated it."""
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    fields = [f for f in dataclasses.fields(cls) if f.init]
    assert [p.name for p in params] == [f.name for f in fields]
    assert [p.default for p in params] == [
        inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default for f in fields
    ]


def test_scheduler_output_still_counts_its_work():
    """SchedulerOutput's __post_init__ still runs (its init=False counts)."""
    out = SchedulerOutput((ScheduledRequest("a", (1, 2, 3), 4, (0,), True),), 3, 0)
    assert (out.num_context_tokens, out.num_attended_tokens) == (7, 3 * 4 + 6)


def test_classes_it_does_not_handle_are_refused():
    @dataclasses.dataclass
    class Mutable:
        x: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class Slotted:
        x: int

    @dataclasses.dataclass(frozen=True)
    class Factory:
        x: list = dataclasses.field(default_factory=list)

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class KeywordOnly:
        x: int

    for cls in (Mutable, Slotted, Factory, KeywordOnly, int):
        with pytest.raises(TypeError, match="fast_init"):
            fast_init(cls)
