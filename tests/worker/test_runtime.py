"""The worker runtime over in-memory fakes, on Trio's virtual clock (autojump_clock).

Each test name states the behaviour it checks.
"""

from __future__ import annotations

import itertools
import logging
import uuid
from collections.abc import Callable
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from tests.fakes.runtime import FakeQueue, FakeSteps, refuse
from trioindex.config import WorkerSettings, default_settings
from trioindex.errors import (
    ContentInvalid,
    FailureType,
    ObjectNotFound,
    OwnershipLost,
    ProviderRejectedInput,
    ProviderUnavailable,
    ResultInvalid,
    StateInconsistent,
    StorageUnavailable,
)
from trioindex.values import Claim
from trioindex.worker import metrics
from trioindex.worker.job import (
    CANCELLED,
    RELEASED,
    REPORT_FAILED,
    SUCCEEDED,
    JobOutcome,
    OutcomeKind,
)
from trioindex.worker.runtime import Worker

# a queued job as its claim will carry it (Claim.chunks_ready): NEW has no chunk set stored yet
# (the job parses first), CHUNKED has its set stored (an earlier attempt or another model's job
# made it: the job only embeds)
NEW, CHUNKED = False, True


def settings(**changes: Any) -> WorkerSettings:
    base = attrs.evolve(
        default_settings().worker,
        polling_interval=1.0,
        max_concurrency=2,
        lease_duration=300.0,
        lease_renewal_interval=60.0,
        shutdown_grace_period=30.0,
        heartbeat_interval=10.0,
        recovery_interval=30.0,
    )
    return attrs.evolve(base, **changes)


def make_worker(queue: FakeQueue, steps: FakeSteps, **changes: Any) -> Worker:
    return Worker(queue=queue, steps=steps, settings=settings(**changes))


async def drain(worker: Worker) -> None:
    # a run that blocks for good (a slot never given back, ...) fails at once on the virtual
    # clock instead of hanging the test run
    with trio.fail_after(1_000_000):
        await worker.serve(drain=True)


def assert_clean(worker: Worker) -> None:
    """No slot, finishing place, job context or renewal task outlives the run."""
    assert worker.running_jobs == 0
    assert worker._run is not None
    assert worker._run.slots.borrowed_tokens == 0
    assert worker._run.finishing.borrowed_tokens == 0
    assert worker._run.jobs.leases.held == 0


# --- polling ---------------------------------------------------------------------------------


async def test_polling_skipped_until_worker_registered(autojump_clock: trio.abc.Clock) -> None:
    queue = FakeQueue(pending=[NEW], registered=trio.Event())
    worker = make_worker(queue, FakeSteps(queue))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(drain, worker)
        await trio.sleep(100)
        assert queue.names() == []  # no claim, no heartbeat while registration is pending
        assert queue.registered is not None
        queue.registered.set()
    assert queue.names().index("register") < queue.names().index("claim")


async def test_empty_queue_is_a_normal_result_without_info_logs(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    queue = FakeQueue()
    worker = make_worker(queue, FakeSteps(queue))
    with caplog.at_level(logging.INFO):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.serve)
            await trio.sleep(10.5)
            worker.request_stop()
    claims = queue.of("claim")
    assert len(claims) == 11  # one poll per polling interval, no busy loop
    assert all(result == (2, 0) for _, result in claims)
    assert worker.counters.empty_polls == 11
    assert not [
        r for r in caplog.records if r.levelno >= logging.INFO and "nothing" in r.getMessage()
    ]


async def test_claims_ask_for_exactly_the_free_slots(autojump_clock: trio.abc.Clock) -> None:
    queue = FakeQueue(pending=[NEW] * 5)
    worker = make_worker(queue, FakeSteps(queue, duration=10), max_concurrency=3)
    await drain(worker)
    asked = [k for _, (k, _) in queue.of("claim")]  # type: ignore[misc]
    assert asked[0] == 3
    assert all(1 <= k <= 3 for k in asked)
    assert len(queue.of("complete")) == 5
    assert_clean(worker)


async def test_never_more_than_max_concurrency_jobs_run(autojump_clock: trio.abc.Clock) -> None:
    queue = FakeQueue(pending=[NEW] * 25)
    steps = FakeSteps(queue, duration=3)
    worker = make_worker(queue, steps, max_concurrency=4)
    await drain(worker)
    assert steps.max_active == 4
    assert len(queue.of("complete")) == 25
    assert_clean(worker)


async def test_a_job_writing_its_completion_gives_its_slot_to_the_next_claim(
    autojump_clock: trio.abc.Clock,
) -> None:
    queue = FakeQueue(pending=[NEW] * 2, complete_seconds=10.0)
    steps = FakeSteps(queue, duration=1)
    worker = make_worker(queue, steps, max_concurrency=1)
    await drain(worker)
    parses = [t for t, _ in queue.of("parse")]
    completes = [t for t, _ in queue.of("complete")]
    # the second job was claimed and parsed while the first one's completion was committing
    assert len(parses) == 2 and len(completes) == 2
    assert parses[1] < completes[0]
    assert steps.max_active == 1
    assert_clean(worker)


async def test_completions_in_flight_are_bounded_by_max_concurrency(
    autojump_clock: trio.abc.Clock,
) -> None:
    queue = FakeQueue(pending=[NEW] * 12)
    steps = FakeSteps(queue, duration=0)
    writing = 0
    most_writing = 0
    most_held = 0
    worker = make_worker(queue, steps, max_concurrency=2)

    async def slow_commit(_claim: Claim) -> None:
        nonlocal writing, most_writing, most_held
        writing += 1
        most_writing = max(most_writing, writing)
        most_held = max(most_held, worker.running_jobs)
        await trio.sleep(10)
        writing -= 1

    queue.complete_behaviour = slow_commit
    await drain(worker)
    assert len(queue.of("complete")) == 12
    # two jobs run their steps while four completions commit: never more claims held
    assert most_writing == 4
    assert most_held <= 6
    assert_clean(worker)


async def test_busy_drain_claims_again_at_once_while_jobs_keep_coming(
    autojump_clock: trio.abc.Clock,
) -> None:
    queue = FakeQueue(pending=[NEW] * 6)
    worker = make_worker(
        queue, FakeSteps(queue, duration=0), max_concurrency=2, polling_interval=100.0
    )
    start = trio.current_time()
    await drain(worker)
    # six jobs through two slots never waited a polling interval
    assert trio.current_time() - start < 100
    assert len(queue.of("complete")) == 6


async def test_claim_error_is_logged_and_polling_continues(autojump_clock: trio.abc.Clock) -> None:
    queue = FakeQueue(pending=[NEW], claim_error=RuntimeError("db down"))
    worker = make_worker(queue, FakeSteps(queue))
    await drain(worker)
    assert queue.names().count("claim-error") == 1
    assert len(queue.of("complete")) == 1
    # a failure before any attempt exists reports nothing
    assert queue.of("fail") == []
    assert_clean(worker)


# --- step selection and replay ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("chunks_ready", "expected"),
    [
        (NEW, ["parse", "embed", "complete"]),
        # an earlier attempt stored the set, or another model's job did (a model switch's job
        # embeds the stored chunks)
        (CHUNKED, ["embed", "complete"]),
    ],
)
async def test_whether_the_chunk_set_is_stored_selects_the_steps(
    autojump_clock: trio.abc.Clock, chunks_ready: bool, expected: list[str]
) -> None:
    queue = FakeQueue(pending=[chunks_ready])
    await drain(make_worker(queue, FakeSteps(queue)))
    run = [n for n in queue.names() if n in ("parse", "embed", "complete")]
    assert run == expected


async def test_idempotent_replay_of_a_half_done_job_after_recovery(
    autojump_clock: trio.abc.Clock,
) -> None:
    # first claim: parse done, embedding fails transiently; the re-claim finds the chunk set
    # stored and resumes at embed (the steps' own replay makes the repeated embed converge)
    queue = FakeQueue(pending=[NEW, CHUNKED])
    steps = FakeSteps(queue, behaviour={"embed": _fail_once(ProviderUnavailable("503"))})
    await drain(make_worker(queue, steps, max_concurrency=1))
    assert [n for n in queue.names() if n in ("parse", "embed", "complete", "fail")] == [
        "parse",
        "embed",
        "fail",
        "embed",
        "complete",
    ]


def _fail_once(error: Exception) -> Any:
    state = {"failed": False}

    async def behaviour(claim: Claim) -> None:
        if not state["failed"]:
            state["failed"] = True
            raise error

    return behaviour


# --- lease renewal ------------------------------------------------------------------------------


async def test_renewal_runs_on_absolute_deadlines_and_stops_with_the_job(
    autojump_clock: trio.abc.Clock,
) -> None:
    queue = FakeQueue(pending=[NEW])
    worker = make_worker(queue, FakeSteps(queue, duration=125))  # parse 125s, embed 125s
    start = trio.current_time()
    await drain(worker)
    renew_times = [t - start for t, _ in queue.of("renew")]
    assert renew_times == pytest.approx([60, 120, 180, 240], abs=0.5)
    complete_at = queue.of("complete")[0][0]
    assert all(t < complete_at for t, _ in queue.of("renew"))
    async with trio.open_nursery() as nursery:  # nothing renews after the job is done
        nursery.start_soon(trio.sleep, 1000)
    assert len(queue.of("renew")) == 4
    assert_clean(worker)


async def test_one_renewer_renews_every_job_in_time_in_few_statements(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Four jobs claimed 20 s apart, each running 400 s: every job's lease is renewed within an
    interval of its claim and of its last renewal, and those due within half an interval of
    each other share one statement."""
    queue = FakeQueue(later=[(20.0 * i, NEW) for i in range(4)])
    worker = make_worker(queue, FakeSteps(queue, duration=200), max_concurrency=4)
    await drain(worker)
    claimed: dict[object, float] = {}
    for t, name, detail in queue.calls:
        if name == "parse":
            claimed.setdefault(detail, t)
    renewed: dict[object, list[float]] = {job: [] for job in claimed}
    for t, job in queue.of("renew"):
        renewed[job].append(t)
    assert len(claimed) == 4
    for job, started in claimed.items():
        times = [started, *renewed[job]]
        assert len(times) >= 7  # 400 s of steps at most 60 s apart
        assert max(b - a for a, b in itertools.pairwise(times)) <= 60.0 + 1e-6
    calls = queue.of("renew-call")
    assert sum(n for _, n in calls) == len(queue.of("renew"))  # type: ignore[misc]
    assert len(calls) <= len(queue.of("renew")) / 2
    assert_clean(worker)


async def test_lost_lease_cancels_the_job_and_blocks_later_writes(
    autojump_clock: trio.abc.Clock,
) -> None:
    async def refuse_second(claim: Claim, count: int) -> None:
        if count >= 2:
            raise OwnershipLost("recovered by another worker")

    queue = FakeQueue(pending=[NEW], renew_behaviour=refuse_second)
    worker = make_worker(queue, FakeSteps(queue, duration=1000))
    await drain(worker)
    assert queue.of("complete") == []
    assert queue.of("fail") == []
    assert "embed" not in queue.names()  # cancelled inside parse, nothing later ran
    assert worker.counters.lost == 1
    assert_clean(worker)


async def test_a_refused_lease_in_a_group_renewal_cancels_that_job_alone(
    autojump_clock: trio.abc.Clock,
) -> None:
    refused: list[object] = []

    async def refuse_one_job(claim: Claim, count: int) -> None:
        if not refused:
            refused.append(claim.job_id)
        if claim.job_id == refused[0]:
            raise OwnershipLost("recovered by another worker")

    queue = FakeQueue(pending=[NEW] * 3, renew_behaviour=refuse_one_job)
    worker = make_worker(queue, FakeSteps(queue, duration=100), max_concurrency=3)
    await drain(worker)
    assert queue.of("renew-call")[0][1] == 3  # the three leases in one call
    completed = {job for _, job in queue.of("complete")}
    assert len(completed) == 2 and refused[0] not in completed
    assert "embed" not in [n for _, n, job in queue.calls if job == refused[0]]
    assert worker.counters.lost == 1 and worker.counters.succeeded == 2
    assert_clean(worker)


async def test_transient_renewal_errors_are_retried_until_the_lease_would_expire(
    autojump_clock: trio.abc.Clock,
) -> None:
    async def always_error(claim: Claim, count: int) -> None:
        raise RuntimeError("connection reset")

    queue = FakeQueue(pending=[NEW], renew_behaviour=always_error)
    worker = make_worker(queue, FakeSteps(queue, duration=10_000))
    start = trio.current_time()
    await drain(worker)
    renew_times = [t - start for t, _ in queue.of("renew")]
    assert len(renew_times) > 200  # retried about once a second
    assert renew_times[-1] == pytest.approx(300, abs=1.5)  # gave up when the lease ran out
    assert queue.of("complete") == []
    assert queue.of("fail") == []
    assert worker.counters.lost == 1


async def test_each_successful_renewal_extends_how_long_renewal_errors_are_retried(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Five renewals succeed (the last at 300 s), then every renewal fails: the worker keeps
    retrying until the lease the last success bought runs out (600 s), not the first (300 s)."""

    async def ok_then_errors(claim: Claim, count: int) -> None:
        if count > 5:
            raise RuntimeError("connection reset")

    queue = FakeQueue(pending=[NEW], renew_behaviour=ok_then_errors)
    worker = make_worker(queue, FakeSteps(queue, duration=10_000))
    start = trio.current_time()
    await drain(worker)
    renew_times = [t - start for t, _ in queue.of("renew")]
    assert renew_times[:5] == pytest.approx([60, 120, 180, 240, 300], abs=0.5)
    assert renew_times[-1] == pytest.approx(600, abs=1.5)
    assert worker.counters.lost == 1


async def test_transient_renewal_error_then_success_keeps_the_job(
    autojump_clock: trio.abc.Clock,
) -> None:
    async def flaky(claim: Claim, count: int) -> None:
        if count <= 3:
            raise RuntimeError("blip")

    queue = FakeQueue(pending=[NEW], renew_behaviour=flaky)
    worker = make_worker(queue, FakeSteps(queue, duration=100))
    await drain(worker)
    assert len(queue.of("complete")) == 1
    assert worker.counters.renewal_errors == 3


# --- failures ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "failure_type"),
    [
        (StorageUnavailable("MinIO read failed"), FailureType.STORAGE_UNAVAILABLE),
        (ObjectNotFound("missing"), FailureType.STORAGE_UNAVAILABLE),
        (ContentInvalid("unsupported format"), FailureType.DOCUMENT_CONTENT_INVALID),
        (ProviderUnavailable("HTTP 503"), FailureType.EMBEDDING_PROVIDER_UNAVAILABLE),
        (ResultInvalid("dimension 3, expected 4"), FailureType.EMBEDDING_RESULT_INVALID),
        (ProviderRejectedInput("HTTP 413"), FailureType.EMBEDDING_RESULT_INVALID),
        (StateInconsistent("partial set"), FailureType.INDEXING_STATE_INCONSISTENT),
        (KeyError("chunk text here"), FailureType.WORKER_INTERNAL_ERROR),
    ],
)
async def test_each_failure_cause_maps_to_its_type(
    autojump_clock: trio.abc.Clock, error: Exception, failure_type: FailureType
) -> None:
    async def raise_it(claim: Claim) -> None:
        raise error

    queue = FakeQueue(pending=[NEW])
    await drain(make_worker(queue, FakeSteps(queue, behaviour={"parse": raise_it})))
    ((_, (_, reported, message)),) = queue.of("fail")  # type: ignore[misc]
    assert reported is failure_type
    assert "chunk text here" not in message  # unknown errors are reported by class only
    assert queue.of("complete") == []


async def test_refused_fail_report_is_left_to_lease_recovery(
    autojump_clock: trio.abc.Clock,
) -> None:
    async def raise_it(claim: Claim) -> None:
        raise ProviderUnavailable("timeout")

    queue = FakeQueue(pending=[NEW], fail_behaviour=refuse)
    worker = make_worker(queue, FakeSteps(queue, behaviour={"embed": raise_it}))
    await drain(worker)
    assert len(queue.of("fail")) == 1  # reported once, not "corrected" or retried
    assert queue.of("complete") == []
    assert worker.counters.report_refused == 1
    assert_clean(worker)


async def test_one_job_failure_does_not_stop_another_slot(autojump_clock: trio.abc.Clock) -> None:
    failing: set[object] = set()

    async def fail_first(claim: Claim) -> None:
        if not failing:
            failing.add(claim.job_id)
            raise ContentInvalid("empty document")

    queue = FakeQueue(pending=[NEW, NEW, NEW])
    steps = FakeSteps(queue, duration=5, behaviour={"parse": fail_first})
    worker = make_worker(queue, steps, max_concurrency=2)
    await drain(worker)
    assert len(queue.of("fail")) == 1
    completed = {job for _, job in queue.of("complete")}
    assert len(completed) == 2
    assert not completed & failing
    assert_clean(worker)


class Fatal(BaseException):
    """Stands in for KeyboardInterrupt/SystemExit-class errors."""


async def test_non_exception_errors_are_never_reported_as_retryable(
    autojump_clock: trio.abc.Clock,
) -> None:
    async def die(claim: Claim) -> None:
        raise Fatal

    queue = FakeQueue(pending=[NEW])
    worker = make_worker(queue, FakeSteps(queue, behaviour={"parse": die}))
    with pytest.RaisesGroup(Fatal, flatten_subgroups=True):
        await drain(worker)
    assert queue.of("fail") == []
    assert queue.names()[-1] == "status:STOPPED"
    assert_clean(worker)


# --- shutdown ---------------------------------------------------------------------------------


async def test_shutdown_stops_claims_first_and_waits_for_running_jobs(
    autojump_clock: trio.abc.Clock,
) -> None:
    queue = FakeQueue(pending=[NEW, NEW, NEW, NEW])
    worker = make_worker(queue, FakeSteps(queue, duration=5), max_concurrency=2)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker.serve)
        await trio.sleep(1)  # two jobs running, two waiting in the queue
        worker.request_stop()
    names = queue.names()
    stopping = names.index("status:STOPPING")
    assert "claim" not in names[stopping:]  # no claim after intake stopped
    assert names[-1] == "status:STOPPED"
    assert len(queue.of("complete")) == 2  # finished within the grace period
    assert len(queue.pending) == 2  # never claimed
    assert queue.of("fail") == []
    assert_clean(worker)


async def test_a_job_cancelled_while_waiting_for_a_finishing_place_is_handed_back(
    autojump_clock: trio.abc.Clock,
) -> None:
    queue = FakeQueue(pending=[NEW, NEW, NEW], complete_seconds=100.0)
    outcomes: list[JobOutcome] = []
    worker = make_worker(
        queue, FakeSteps(queue, duration=1), max_concurrency=1, shutdown_grace_period=10.0
    )
    worker.on_job_done = lambda _claim, outcome: outcomes.append(outcome)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker.serve)
        # the first two jobs' completions commit for 100 s from 2 s and 4 s, in the two
        # finishing places; the third job's steps end at 6 s and it waits, in its slot, for one
        await trio.sleep(7)
        worker.request_stop()
    parsed = [job for _, job in queue.of("parse")]
    assert sorted(str(job) for _, job in queue.of("complete")) == sorted(map(str, parsed[:2]))
    assert [job for _, job in queue.of("release")] == [parsed[2]]
    assert sorted(outcomes, key=str) == [RELEASED, SUCCEEDED, SUCCEEDED]
    assert_clean(worker)


async def test_jobs_past_the_grace_period_are_cancelled_not_failed(
    autojump_clock: trio.abc.Clock,
) -> None:
    queue = FakeQueue(pending=[NEW, NEW])
    worker = make_worker(queue, FakeSteps(queue, duration=1000), shutdown_grace_period=30.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker.serve)
        await trio.sleep(1)
        worker.request_stop()
        stop_requested_at = trio.current_time()
    assert trio.current_time() - stop_requested_at == pytest.approx(30, abs=0.5)
    assert queue.of("fail") == []
    assert queue.of("complete") == []
    assert worker.counters.cancelled == 2
    assert queue.names()[-1] == "status:STOPPED"
    renewals_at_stop = len(queue.of("renew"))
    await trio.sleep(500)
    assert len(queue.of("renew")) == renewals_at_stop  # renewal cancelled with its job
    assert_clean(worker)


async def test_shutdown_with_zero_grace_cancels_at_once(autojump_clock: trio.abc.Clock) -> None:
    queue = FakeQueue(pending=[NEW])
    worker = make_worker(queue, FakeSteps(queue, duration=1000), shutdown_grace_period=0.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker.serve)
        await trio.sleep(1)
        worker.request_stop()
        requested = trio.current_time()
    assert trio.current_time() - requested < 0.1
    assert worker.counters.cancelled == 1
    assert_clean(worker)


async def test_stop_requested_before_start_claims_nothing(autojump_clock: trio.abc.Clock) -> None:
    queue = FakeQueue(pending=[NEW])
    worker = make_worker(queue, FakeSteps(queue))
    worker.request_stop()
    await worker.serve()
    assert "claim" not in queue.names()
    assert queue.names()[-1] == "status:STOPPED"


async def test_heartbeats_follow_the_interval(autojump_clock: trio.abc.Clock) -> None:
    queue = FakeQueue()
    worker = make_worker(queue, FakeSteps(queue), heartbeat_interval=10.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker.serve)
        await trio.sleep(35)
        worker.request_stop()
    assert len(queue.of("heartbeat")) == 3
    assert len(queue.of("recover")) == 2  # at start and at 30s


async def test_a_notify_wakes_the_poller_before_the_interval(
    autojump_clock: trio.abc.Clock,
) -> None:
    queue = FakeQueue()
    worker = make_worker(queue, FakeSteps(queue, duration=0), polling_interval=60.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker.serve)
        await trio.sleep(5)
        queue.pending.append(NEW)
        worker.wake()
        await trio.testing.wait_all_tasks_blocked()
        await trio.sleep(1)
        assert len(queue.of("complete")) == 1  # did not wait for the 60s poll
        worker.request_stop()


@attrs.define(eq=False)
class FakeListener:
    """Stands for the LISTEN connection: the test says when its LISTEN is up or lost."""

    on_listening: Callable[[bool], None] | None = None

    async def __call__(
        self, on_notify: Callable[[], None], on_listening: Callable[[bool], None]
    ) -> None:
        self.on_listening = on_listening
        await trio.sleep_forever()

    def say(self, live: bool) -> None:
        assert self.on_listening is not None
        self.on_listening(live)


async def test_an_idle_worker_polls_less_often_while_its_listen_is_up(
    autojump_clock: trio.abc.Clock,
) -> None:
    queue = FakeQueue()
    listener = FakeListener()
    worker = make_worker(queue, FakeSteps(queue), polling_interval=1.0)
    worker.listener = listener
    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker.serve)
        await trio.sleep(0.5)
        listener.say(True)  # the poller waits out the interval it began: it claims at 1.0
        await trio.sleep(26)
        listener.say(False)  # at 26.5: NOTIFYs may be missed from here on
        await trio.sleep(3.5)
        listener.say(True)  # at 30: back, after NOTIFYs may have been missed
        await trio.sleep(6)
        worker.request_stop()
    assert [t for t, _ in queue.of("claim")] == [
        *(0.0, 1.0, 6.0, 11.0, 16.0, 21.0, 26.0),  # every 5 s while listening
        *(26.5, 27.5, 28.5, 29.5),  # at once when it is lost, then every second
        *(30.0, 35.0),  # at once when it is back, then every 5 s
    ]


def staggered(queue: FakeQueue) -> FakeSteps:
    """Steps where the n-th job claimed (from 0) embeds for n more seconds than the first."""
    extra: dict[uuid.UUID, int] = {}

    async def embed(claim: Claim) -> None:
        await trio.sleep(extra.setdefault(claim.job_id, len(extra)))

    return FakeSteps(queue, duration=1.0, behaviour={"embed": embed})


def claims_made(queue: FakeQueue) -> list[tuple[float, int]]:
    """(virtual time, jobs claimed) of every claim."""
    made: list[tuple[float, int]] = []
    for t, detail in queue.of("claim"):
        _asked, got = detail
        made.append((t, got))
    return made


async def test_after_a_claim_short_of_its_slots_jobs_ending_do_not_claim_again(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A claim that returned fewer jobs than it asked for found no other row to take: a freed
    slot says nothing of that queue. In a fleet, each worker holding the last jobs of a
    backlog would otherwise claim (and find nothing) per job."""
    queue = FakeQueue(pending=[CHUNKED] * 5)
    worker = make_worker(queue, staggered(queue), max_concurrency=8, polling_interval=60.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker.serve)
        await trio.sleep(10)
        worker.request_stop()
    assert len(queue.of("complete")) == 5  # at 1, 2, 3, 4 and 5 s
    assert claims_made(queue) == [(0.0, 5)]  # nothing more until the 60 s poll


async def test_in_a_drain_the_last_job_ending_claims_once_more(
    autojump_clock: trio.abc.Clock,
) -> None:
    """So the drain is checked as soon as nothing runs, not at the next poll."""
    queue = FakeQueue(pending=[CHUNKED] * 5)
    worker = make_worker(queue, staggered(queue), max_concurrency=8, polling_interval=60.0)
    await drain(worker)
    assert claims_made(queue) == [(0.0, 5), (5.0, 0)]
    assert [t for t, _ in queue.of("drain-state")] == [5.0]


async def test_documents_arriving_one_at_a_time_cost_one_claim_each(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Each NOTIFY claims the job it announced; the job's end claims nothing."""
    queue = FakeQueue()
    worker = make_worker(queue, FakeSteps(queue, duration=0.5), polling_interval=60.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker.serve)
        for _ in range(10):
            await trio.sleep(1)
            queue.pending.append(CHUNKED)
            worker.wake()
        await trio.sleep(5)
        worker.request_stop()
    assert len(queue.of("complete")) == 10
    # the claim at start, then one a job
    assert claims_made(queue) == [(0.0, 0)] + [(float(n), 1) for n in range(1, 11)]


async def test_after_an_empty_claim_a_notify_claims_at_once_while_jobs_run(
    autojump_clock: trio.abc.Clock,
) -> None:
    queue = FakeQueue(pending=[CHUNKED] * 5)
    worker = make_worker(queue, staggered(queue), max_concurrency=8, polling_interval=60.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker.serve)
        await trio.sleep(2.5)
        queue.pending.append(CHUNKED)
        worker.wake()
        await trio.sleep(0.1)
        assert claims_made(queue)[-1] == (2.5, 1)
        worker.request_stop()


@attrs.define(eq=False)
class SlowClaimQueue(FakeQueue):
    """A claim's statement sees the queue when it starts and returns ``claim_seconds`` later."""

    claim_seconds: float = 0.5

    async def claim(self, worker_id: uuid.UUID, k: int, model_id: uuid.UUID | None = None) -> Any:
        claims = await super().claim(worker_id, k, model_id)
        await trio.sleep(self.claim_seconds)
        return claims


def ending_at(queue: FakeQueue, extra: list[float]) -> FakeSteps:
    """Steps where the n-th job claimed embeds ``extra[n]`` seconds longer than the first."""
    seen: dict[uuid.UUID, float] = {}

    async def embed(claim: Claim) -> None:
        await trio.sleep(seen.setdefault(claim.job_id, extra[len(seen)]))

    return FakeSteps(queue, duration=1.0, behaviour={"embed": embed})


async def test_slots_freed_while_a_claim_finds_nothing_do_not_claim_again(
    autojump_clock: trio.abc.Clock,
) -> None:
    queue = SlowClaimQueue(pending=[CHUNKED] * 5)
    steps = ending_at(queue, [0, 0.25, 2, 3, 4])  # the jobs end at 1.5, 1.75, 3.5, 4.5, 5.5
    worker = make_worker(queue, steps, max_concurrency=5, polling_interval=60.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker.serve)
        await trio.sleep(10)
        worker.request_stop()
    # the first claim filled every slot, so the first job's end claims (1.5-2.0, finding
    # nothing); the second job ends while that claim is in flight
    assert claims_made(queue) == [(0.0, 5), (1.5, 0)]


async def test_a_notify_during_a_claim_that_finds_nothing_claims_again_at_once(
    autojump_clock: trio.abc.Clock,
) -> None:
    queue = SlowClaimQueue(pending=[CHUNKED] * 5)
    steps = ending_at(queue, [0, 2, 3, 4, 5])
    worker = make_worker(queue, steps, max_concurrency=5, polling_interval=60.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker.serve)
        await trio.sleep(1.6)  # a claim started at 1.5 saw an empty queue
        queue.pending.append(CHUNKED)  # enqueued after that claim's statement began
        worker.wake()
        await trio.sleep(1)
        assert claims_made(queue)[1:] == [(1.5, 0), (2.0, 1)]
        worker.request_stop()


@attrs.define(eq=False)
class RowLockQueue(FakeQueue):
    """Models the job row lock the final write holds: a renewal that reaches the database while
    the completion runs waits for it, like the real UPDATE, and is then refused because the job
    is SUCCEEDED. Neither call can be abandoned (both run in threads), so both are shielded."""

    complete_takes: float = 5.0
    completing: bool = False
    committed: trio.Event = attrs.field(factory=trio.Event)

    async def complete(self, claim: Claim) -> Any:
        self.completing = True
        with trio.CancelScope(shield=True):
            await trio.sleep(self.complete_takes)
        result = await super().complete(claim)
        self.committed.set()
        return result

    async def renew(self, claim: Claim) -> Any:
        self.log("renew-sent", claim.job_id)
        with trio.CancelScope(shield=True):
            await trio.sleep(1)  # the round trip
            if self.completing:
                await self.committed.wait()  # the row lock
        if self.committed.is_set():
            self.log("renew-refused", claim.job_id)
            raise OwnershipLost("the job is SUCCEEDED, not PROCESSING")
        return await super().renew(claim)


def leases_lost() -> float:
    return metrics.REGISTRY.get_sample_value("trioindex_leases_lost_total") or 0.0


async def test_a_renewal_refused_because_the_final_write_finished_the_job_is_not_a_lost_lease(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """The renewal is sent first (at 60 s, while embed still runs); the completion starts at
    60.5 s and holds the row; the renewal waits for it and is refused once the job is done."""
    queue = RowLockQueue(pending=[NEW])
    worker = make_worker(queue, FakeSteps(queue, duration=30.25), lease_renewal_interval=60.0)
    lost_before = leases_lost()
    with caplog.at_level(logging.WARNING, logger="trioindex.worker.job"):
        await drain(worker)
    (sent_at, _), *_ = queue.of("renew-sent")
    (completed_at, _), *_ = queue.of("complete")
    assert sent_at < completed_at  # in flight before the final write began, and across it
    assert [t for t, _ in queue.of("renew-refused")] == [pytest.approx(completed_at)]
    assert worker.counters.succeeded == 1
    assert worker.counters.lost == 0
    assert leases_lost() == lost_before
    assert not [r for r in caplog.records if "renewal refused" in r.getMessage()]
    assert_clean(worker)


async def test_no_renewal_is_sent_while_the_final_write_runs(
    autojump_clock: trio.abc.Clock,
) -> None:
    """The final write re-validates ownership itself: a renewal due while it runs (at 60 s,
    inside 59.5-64.5 s) is not sent to wait on the row lock."""
    queue = RowLockQueue(pending=[NEW])
    # parse + embed take 59.5 s, so the 60 s renewal falls due while complete holds the lock
    worker = make_worker(queue, FakeSteps(queue, duration=29.75), lease_renewal_interval=60.0)
    await drain(worker)
    assert queue.of("renew-sent") == []
    assert worker.counters.succeeded == 1
    assert worker.counters.lost == 0
    assert_clean(worker)


# --- shutdown hands claims back (issue 11 §3) -------------------------------------------------


async def test_jobs_cancelled_at_shutdown_are_handed_back_before_stopped(
    autojump_clock: trio.abc.Clock,
) -> None:
    queue = FakeQueue(pending=[NEW, NEW])
    outcomes: list[JobOutcome] = []
    worker = make_worker(queue, FakeSteps(queue, duration=1000), shutdown_grace_period=5.0)
    worker.on_job_done = lambda claim, outcome: outcomes.append(outcome)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker.serve)
        await trio.sleep(1)
        worker.request_stop()
    names = queue.names()
    released = [i for i, name in enumerate(names) if name == "release"]
    assert len(released) == 2
    assert max(released) < names.index("status:STOPPED")
    # handed back only after the grace period, never failed
    assert all(t >= 6.0 for t, _ in queue.of("release"))
    assert queue.of("fail") == []
    assert outcomes == [RELEASED, RELEASED]
    assert_clean(worker)


async def test_a_hand_back_that_cannot_be_written_leaves_the_job_to_recovery(
    autojump_clock: trio.abc.Clock,
) -> None:
    queue = FakeQueue(pending=[NEW], release_error=ConnectionError("database down"))
    outcomes: list[JobOutcome] = []
    worker = make_worker(queue, FakeSteps(queue, duration=1000), shutdown_grace_period=1.0)
    worker.on_job_done = lambda claim, outcome: outcomes.append(outcome)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker.serve)
        await trio.sleep(1)
        worker.request_stop()
    assert outcomes == [CANCELLED]
    assert queue.names()[-1] == "status:STOPPED"
    assert_clean(worker)


async def test_a_hung_hand_back_is_bounded(autojump_clock: trio.abc.Clock) -> None:
    async def hang(claim: Claim) -> None:
        await trio.sleep(50_000)  # virtual time: a hand-back that does not come back

    queue = FakeQueue(pending=[NEW], release_behaviour=hang)
    worker = make_worker(queue, FakeSteps(queue, duration=1000), shutdown_grace_period=1.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker.serve)
        await trio.sleep(1)
        worker.request_stop()
        requested = trio.current_time()
    # grace period, then at most the cleanup bound for the hand-back
    assert trio.current_time() - requested == pytest.approx(1.0 + 10.0, abs=0.5)
    assert queue.names()[-1] == "status:STOPPED"


async def test_a_hung_failure_report_is_bounded(autojump_clock: trio.abc.Clock) -> None:
    async def invalid(claim: Claim) -> None:
        raise ContentInvalid("not a document")

    async def hang(claim: Claim) -> None:
        await trio.sleep(50_000)  # virtual time: a report that does not come back

    queue = FakeQueue(pending=[NEW], fail_behaviour=hang)
    outcomes: list[JobOutcome] = []
    worker = make_worker(queue, FakeSteps(queue, duration=1, behaviour={"parse": invalid}))
    worker.on_job_done = lambda claim, outcome: outcomes.append(outcome)
    await drain(worker)
    (reported_at, _), *_ = queue.of("fail")
    assert trio.current_time() - reported_at == pytest.approx(10.0, abs=0.5)  # CLEANUP_TIMEOUT
    assert outcomes == [REPORT_FAILED]
    assert worker.counters.report_refused == 1


@attrs.define(eq=False)
class SlowStatusQueue(FakeQueue):
    """Status writes take time like the real ones (a thread: at least one checkpoint); the one
    named by ``hang`` never comes back."""

    hang: str | None = None

    async def set_worker_status(self, worker_id: Any, status: Any) -> None:
        await trio.lowlevel.checkpoint()
        await super().set_worker_status(worker_id, status)
        if status.value == self.hang:
            await trio.sleep(50_000)  # virtual time


async def test_stopped_is_written_when_the_worker_is_cancelled_from_outside(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A second signal cancels everything at once; STOPPED is still written."""
    queue = SlowStatusQueue(pending=[NEW])
    worker = make_worker(queue, FakeSteps(queue, duration=1000))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker.serve)
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert queue.names()[-1] == "status:STOPPED"


@pytest.mark.parametrize("hang", ["STOPPING", "STOPPED"])
async def test_a_hung_status_write_is_bounded(autojump_clock: trio.abc.Clock, hang: str) -> None:
    queue = SlowStatusQueue(hang=hang)
    worker = make_worker(queue, FakeSteps(queue))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker.serve)
        await trio.sleep(1)
        worker.request_stop()
        requested = trio.current_time()
    assert trio.current_time() - requested == pytest.approx(10.0, abs=0.5)  # CLEANUP_TIMEOUT
    assert queue.names()[-1] == "status:STOPPED"


async def test_a_failure_found_as_the_job_is_cancelled_is_still_reported(
    autojump_clock: trio.abc.Clock,
) -> None:
    queue = FakeQueue(pending=[NEW])

    async def slow_then_fail(claim: Claim) -> None:
        # the failure surfaces after the grace period has already cancelled the job's scope
        with trio.CancelScope(shield=True):
            await trio.sleep(10)
        raise ContentInvalid("not a document")

    steps = FakeSteps(queue, duration=0, behaviour={"parse": slow_then_fail})
    worker = make_worker(queue, steps, shutdown_grace_period=1.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker.serve)
        await trio.sleep(1)
        worker.request_stop()
    (report,) = queue.of("fail")
    assert report[1][1] is FailureType.DOCUMENT_CONTENT_INVALID  # type: ignore[index]
    assert queue.of("release") == []  # reported, so not handed back
    assert_clean(worker)


# --- drain waits for work still owed (issue 11 §2) ------------------------------------------------


async def test_drain_waits_for_a_scheduled_retry(autojump_clock: trio.abc.Clock) -> None:
    queue = FakeQueue(later=[(40.0, NEW)])
    await drain(make_worker(queue, FakeSteps(queue)))
    (completed_at, _) = queue.of("complete")[0]
    assert completed_at >= 40.0
    assert queue.later == []
    assert queue.pending == []


async def test_drain_recovers_a_dead_workers_job_when_its_lease_expires(
    autojump_clock: trio.abc.Clock,
) -> None:
    # recovery-interval is far away: drain recovers the expired lease itself
    queue = FakeQueue(orphans=[(100.0, CHUNKED)])
    await drain(make_worker(queue, FakeSteps(queue), recovery_interval=10_000.0))
    assert [t for t, n in queue.of("recover") if n] == [pytest.approx(100.0, abs=1.5)]
    assert len(queue.of("complete")) == 1
    assert queue.orphans == []


async def test_drain_says_what_it_waits_for_without_logging_every_poll(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    queue = FakeQueue(later=[(60.0, NEW)])
    with caplog.at_level(logging.INFO, logger="trioindex.worker.runtime"):
        await drain(make_worker(queue, FakeSteps(queue), polling_interval=1.0))
    waiting = [r.getMessage() for r in caplog.records if "drain waiting" in r.getMessage()]
    assert 1 <= len(waiting) <= 5  # about 60 polls, a few lines
    assert "1 pending job(s)" in waiting[0]
    assert len(queue.of("drain-state")) >= 30


# --- one worker, several runs; outcomes as values -------------------------------------------


async def test_a_worker_can_be_served_again_after_it_stopped(
    autojump_clock: trio.abc.Clock,
) -> None:
    queue = FakeQueue(pending=[NEW])
    worker = make_worker(queue, FakeSteps(queue))
    await drain(worker)
    first = worker.worker_id
    queue.pending.append(NEW)
    queue.worker_id = uuid.uuid4()  # the second registration gets its own id
    await drain(worker)
    assert first is not None
    assert worker.worker_id == queue.worker_id != first
    assert len(queue.of("complete")) == 2
    assert queue.names().count("status:STOPPED") == 2
    assert_clean(worker)


async def test_a_stop_request_ends_one_run_only(autojump_clock: trio.abc.Clock) -> None:
    queue = FakeQueue()
    worker = make_worker(queue, FakeSteps(queue))
    worker.request_stop()
    await worker.serve()
    queue.pending.append(NEW)
    await drain(worker)
    assert len(queue.of("complete")) == 1


def test_outcomes_read_as_logs_have_always_shown_them() -> None:
    assert str(SUCCEEDED) == "succeeded"
    assert str(REPORT_FAILED) == "report-failed"
    retry = JobOutcome(OutcomeKind.RETRY, FailureType.STORAGE_UNAVAILABLE)
    assert str(retry) == "retry:STORAGE_UNAVAILABLE"
    with pytest.raises(ValueError):
        JobOutcome(OutcomeKind.FAILED)  # a failure always names its type
    with pytest.raises(ValueError):
        JobOutcome(OutcomeKind.LOST, FailureType.STORAGE_UNAVAILABLE)


def jobs_total(outcome: str, failure_type: str = "") -> float:
    labels = {"outcome": outcome, "failure_type": failure_type}
    return metrics.REGISTRY.get_sample_value("trioindex_jobs_total", labels) or 0.0


async def test_job_metrics_keep_their_outcome_and_failure_type_labels(
    autojump_clock: trio.abc.Clock,
) -> None:
    queue = FakeQueue(pending=[NEW, NEW])
    steps = FakeSteps(queue, behaviour={"parse": _fail_once(ContentInvalid("not a document"))})
    outcomes: list[JobOutcome] = []
    worker = make_worker(queue, steps)
    worker.on_job_done = lambda claim, outcome: outcomes.append(outcome)
    failed_before = jobs_total("failed", "DOCUMENT_CONTENT_INVALID")
    succeeded_before = jobs_total("succeeded")
    await drain(worker)
    assert sorted(map(str, outcomes)) == ["failed:DOCUMENT_CONTENT_INVALID", "succeeded"]
    assert jobs_total("failed", "DOCUMENT_CONTENT_INVALID") == failed_before + 1
    assert jobs_total("succeeded") == succeeded_before + 1


# --- what the worker's log and metrics say --------------------------------------------------


def outcome_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if " after " in r.getMessage()]


async def test_outcome_lines_name_the_document_key_and_the_failure_message(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    queue = FakeQueue(pending=[NEW, NEW, NEW])
    failures = iter([ContentInvalid("corrupt PDF (PdfStreamError)"), KeyError("chunk text here")])
    claims: list[Claim] = []

    async def parse(claim: Claim) -> None:
        claims.append(claim)
        if len(claims) <= 2:
            raise next(failures)

    worker = make_worker(queue, FakeSteps(queue, behaviour={"parse": parse}), max_concurrency=1)
    with caplog.at_level(logging.INFO, logger="trioindex.worker.job"):
        await drain(worker)
    lines = outcome_lines(caplog)
    assert len(lines) == 3 and len(claims) == 3
    for claim, line in zip(claims, lines, strict=True):
        assert f"job {claim.job_id} " in line and f"key '{claim.document_key}'" in line
        assert str(claim.claim_token) not in caplog.text
    assert lines[0].endswith("(step parse): corrupt PDF (PdfStreamError)")
    assert "failed:DOCUMENT_CONTENT_INVALID" in lines[0]
    # an unknown error shows the class-only message the job row stores, never its text
    assert lines[1].endswith("(step parse): unexpected KeyError during parse")
    assert "chunk text here" not in caplog.text
    assert lines[2].endswith("(step complete)")  # succeeded: no message


async def test_an_outcome_line_shows_a_long_or_multi_line_key_on_one_bounded_line(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    key = "reports/q3\nERROR forged line " + "x" * 900

    class LongKeyQueue(FakeQueue):
        async def claim(self, worker_id: uuid.UUID, k: int, model_id: Any = None) -> list[Claim]:
            return [attrs.evolve(c, document_key=key) for c in await super().claim(worker_id, k)]

    queue = LongKeyQueue(pending=[NEW])
    with caplog.at_level(logging.INFO, logger="trioindex.worker.job"):
        await drain(make_worker(queue, FakeSteps(queue)))
    (line,) = outcome_lines(caplog)
    assert "\n" not in line and "key 'reports/q3 ERROR forged line xxx" in line
    assert "x" * 150 in line and "x" * 200 not in line  # cut to 200 characters


async def test_the_worker_says_once_when_it_is_ready_for_jobs(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    queue = FakeQueue()
    worker = make_worker(queue, FakeSteps(queue), max_concurrency=3, polling_interval=1.0)
    with caplog.at_level(logging.INFO, logger="trioindex.worker.runtime"):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.serve)
            await trio.sleep(10)  # ten empty polls
            worker.request_stop()
    messages = [r.getMessage() for r in caplog.records]
    ready = [i for i, m in enumerate(messages) if "ready: waiting for jobs" in m]
    registered = [i for i, m in enumerate(messages) if " registered " in m]
    assert len(ready) == 1 and registered and registered[0] < ready[0]
    assert messages[ready[0]] == (
        f"worker {queue.worker_id} ready: waiting for jobs"
        " (max-concurrency 3; claims on every 1.0s)"
    )


async def test_a_worker_stopped_before_it_started_never_says_it_is_ready(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    queue = FakeQueue()
    worker = make_worker(queue, FakeSteps(queue))
    worker.request_stop()
    with caplog.at_level(logging.INFO, logger="trioindex.worker.runtime"):
        await worker.serve()
    assert not [r for r in caplog.records if "ready" in r.getMessage()]


def slots_max() -> float | None:
    return metrics.REGISTRY.get_sample_value("trioindex_slots_max")


async def test_slots_max_is_the_max_concurrency_from_the_start_not_after_a_first_job(
    autojump_clock: trio.abc.Clock,
) -> None:
    metrics.SLOTS_MAX.set(0)  # the registry is process-wide: other tests' workers set it
    queue = FakeQueue()
    worker = make_worker(queue, FakeSteps(queue), max_concurrency=7)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.serve)
        assert slots_max() == 7
        await trio.sleep(5)  # idle: no job has run
        assert slots_max() == 7 and queue.of("parse") == []
        worker.request_stop()


def slots_in_use() -> float | None:
    return metrics.REGISTRY.get_sample_value("trioindex_slots_in_use")


async def test_slots_in_use_reads_the_jobs_running_their_steps_when_scraped(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Three jobs run their steps for 10 s each on five slots, then write a 20 s completion
    from a finishing place: the gauge reads 3 while they run, 0 while they complete."""
    queue = FakeQueue(pending=[CHUNKED] * 3, complete_seconds=20.0)
    worker = make_worker(queue, FakeSteps(queue, duration=10), max_concurrency=5)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.serve)
        assert slots_in_use() == 0
        await trio.sleep(5)
        assert slots_in_use() == 3
        await trio.sleep(10)
        assert slots_in_use() == 0 and queue.of("complete") == []
        worker.request_stop()
