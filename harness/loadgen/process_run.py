"""One process's run of its share of the schedule (``ProcessRun``), and the plan it sends.

A run builds the plan as the options scale it (``plan_of``), takes its share
(``split.share``), checks its plan against the master's facts before anything else
(``plan_check``), probes the server, then sends its share with a ``Dispatcher``: rows to
its records (a worker's go to the master: ``forward.py``), each as Locust's request
events (``request_events.fire_row``). Stopped before its schedule has been answered, it
sends nothing more, lets what is in flight finish within the stop timeout and cuts the
rest (``stop``); its summary is written once, whatever happened (``finish``), and handed
to ``on_finished``. ``cut_notice``: what ``-t`` cuts from the schedule, said at the start.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import cast

import gevent
import gevent.event
from gevent.lock import Semaphore
from locust.runners import WorkerRunner

from harness.loadgen import clock
from harness.loadgen import options as opts_mod
from harness.loadgen.client import TRANSPORTS, OpenAIClient, ServerInfo, probe
from harness.loadgen.dispatcher import Dispatcher
from harness.loadgen.forward import ForwardingWriter
from harness.loadgen.plan_check import PlanMismatch, check_plan
from harness.loadgen.prompt_choice import PromptChoice
from harness.loadgen.prompts import DEFAULT_ID_RANGE
from harness.loadgen.records import RecordWriter
from harness.loadgen.request_events import fire_row
from harness.loadgen.run_end import warn_generator_limited
from harness.loadgen.split import Share, share
from harness.profiles import Plan, build_plan
from harness.records.redact import redact_url

log = logging.getLogger("schedscope.loadgen")


def plan_of(profile, options: opts_mod.LoadgenOptions):
    """The profile as the options scale it, and its plan."""
    if options.rate_scale != 1.0:
        profile = profile.with_rate_scale(options.rate_scale)
    profile = profile.with_duration_scale(options.duration_scale)
    seed = profile.seed if options.seed < 0 else options.seed
    return build_plan(profile, seed)


def cut_notice(profile, options: opts_mod.LoadgenOptions, run_time: float | None) -> str | None:
    """What ``-t run_time`` cuts from the schedule (None when it cuts nothing): the
    open-loop requests scheduled at or after ``run_time`` will not be sent."""
    if not run_time:
        return None
    scaled = profile.with_duration_scale(options.duration_scale)
    if run_time >= scaled.duration_s:
        return None
    plan = plan_of(profile, options)
    specs = plan.open_loop_requests()
    unsent = sum(1 for s in specs if s.scheduled_at >= run_time)
    closed = [p.phase.name for p in plan.phases if p.kind == "closed" and p.end_s > run_time]
    msg = (
        f"schedscope: -t {run_time:g}s is shorter than the {plan.duration_s:g} s schedule of "
        f"{plan.profile.name}: the run will be cut, and {unsent} of its {len(specs)} scheduled "
        f"open-loop requests (those scheduled at or after {run_time:g} s) will not be sent"
    )
    if closed:
        msg += f"; closed-loop phase(s) {', '.join(closed)} cut short or not run"
    sessions = plan.sessions()
    late = sum(1 for s in sessions if s.start_at >= run_time)
    if sessions:
        msg += (
            f"; {late} of its {len(sessions)} sessions start at or after {run_time:g} s and "
            "the others' turns after it are not sent"
        )
    return msg + " (their rows: status aborted; not failures)"


class ProcessRun:
    """One process's run of the profile: its share, client, writer and dispatcher.

    ``on_finished(run, summary)`` is called once, when the summary has been written; a
    worker's rows go to the master (``forward.py``), its local copy under
    ``local_records_dir`` (its own ``--records-dir``, else the options')."""

    def __init__(
        self,
        profile,
        environment,
        index: int,
        count: int,
        start_at: float | None,
        options: opts_mod.LoadgenOptions,
        host: str,
        run_id: str,
        master_plan: dict | None = None,
        *,
        on_finished: Callable[[ProcessRun, dict], None],
        local_records_dir: str | None = None,
    ) -> None:
        self.profile = profile
        self.environment = environment
        self.on_finished = on_finished
        self.local_records_dir = local_records_dir
        self.index, self.count = index, count
        self.options = options
        self.host = host
        self.run_id = run_id
        self.start_at = start_at
        #: The master's plan facts (plan_check.plan_facts); None: one process, no check.
        self.master_plan = master_plan
        self.plan_mismatch: dict | None = None
        # None until built: a run whose plan cannot be built still writes its summary
        self.plan: Plan | None = None
        self.info: ServerInfo  # the start-up probes' findings, known before the writer
        self.share: Share | None = None
        self.dispatcher: Dispatcher | None = None
        self.writer: RecordWriter | None = None
        self.summary: dict | None = None
        self.error: str | None = None
        self.draining = False
        #: Requests cut in flight count as failures (the stop came from --grace running out).
        self.cut_is_failure = False
        self.ended = gevent.event.Event()  # set when the summary has been written
        self._finishing = Semaphore()
        self.greenlet = gevent.spawn(self._main)

    def _on_row(self, row: dict, cut: bool) -> None:
        fire_row(self.environment, row, cut and not self.cut_is_failure)

    def _main(self) -> None:
        o = self.options
        try:
            self.plan = plan = plan_of(self.profile, o)
            profile, seed = plan.profile, plan.seed
            self.share = mine = share(plan, self.index, self.count)
            # before the probes: a worker whose schedule is not the master's sends nothing
            check_plan(plan, self.master_plan)
            transport = TRANSPORTS[o.http_client](
                self.host, o.max_in_flight + 16, o.request_timeout
            )
            self.info, sizer = probe(
                transport,
                endpoint=o.endpoint,
                model=o.model,
                api_key=o.api_key,
                prompt_mode=o.prompt_mode,
                continuous=o.continuous_usage,
            )
            prompts = cast(PromptChoice, self.info.prompts)  # the probe always chooses them
            if self.index == 0:
                print(f"schedscope: prompts: {prompts.line()}", file=sys.stderr)
            if sizer is not None:  # size every distinct open-loop length before the start
                for length in sorted({s.prompt_tokens for s in mine.open_requests}):
                    sizer.num_words(length)
            client = OpenAIClient(
                transport,
                endpoint=o.endpoint,
                model=self.info.model,
                api_key=o.api_key,
                prompt_mode=prompts.mode,
                id_range=prompts.id_range or DEFAULT_ID_RANGE,
                continuous_usage=self.info.continuous_usage,
                sizer=sizer,
                profile_name=profile.name,
                run_id=self.run_id,
                worker=self.index,
            )
            runner = self.environment.runner
            if isinstance(runner, WorkerRunner):  # rows go to the master (forward.py)
                local = Path(self.local_records_dir or o.records_dir)
                self.writer = ForwardingWriter(
                    local / f"worker-{self.index}-{os.getpid()}", self.index, runner.send_message
                )
            else:
                self.writer = RecordWriter(o.records_dir, self.index)
            start = self.start_at if self.start_at is not None else clock.unix_now() + 0.1
            if clock.unix_now() > start:
                log.warning(
                    "worker %d was ready %.3f s after the common start instant",
                    self.index,
                    clock.unix_now() - start,
                )
            self.start_at = start
            self.dispatcher = Dispatcher(
                client,
                self.writer,
                plan,
                mine,
                start,
                o.max_in_flight,
                on_row=self._on_row,
            )
            if self.draining:  # stopped while it was starting: nothing will be sent
                self.dispatcher.drain()
            log.info(
                "schedscope: worker %d/%d sends %d open-loop requests, %d closed loops and "
                "%d sessions of %s (seed %d) to %s",
                self.index,
                self.count,
                mine.num_open,
                len(mine.closed_loops),
                len(mine.sessions),
                profile.name,
                seed,
                self.host,
            )
            self.dispatcher.run()
        except gevent.GreenletExit:
            raise
        except PlanMismatch as e:
            log.error("schedscope: worker %d: %s", self.index, e)
            self.plan_mismatch = e.facts
            self.error = str(e)
        except Exception as e:  # noqa: BLE001 - reported, and the run ends
            log.exception("schedscope: the run could not start")
            self.error = f"{type(e).__name__}: {e}"
        self.finish()

    # -- stopping -------------------------------------------------------------------
    def drain(self) -> None:
        """Send nothing more; what is in flight goes on (``ended`` is set when it has)."""
        self.draining = True
        if self.dispatcher is not None:
            self.dispatcher.drain()

    def stop(self, timeout_s: float = 0.0) -> dict | None:
        """Stop sending, let what is in flight finish within ``timeout_s``, cut the rest."""
        self.drain()
        if timeout_s > 0:
            self.ended.wait(timeout_s)
        if not self.ended.is_set():
            self.greenlet.kill(block=True, timeout=15)
        return self.finish()

    def finish(self) -> dict | None:
        """Rows for whatever is left, then the summary (once)."""
        with self._finishing:
            if self.summary is None:
                self._finish()
        return self.summary

    def _finish(self) -> None:
        if self.dispatcher is not None:
            self.dispatcher.stop()
        s = {
            "run_id": self.run_id,
            "worker": self.index,
            "workers": self.count,
            "pid": os.getpid(),
            "host": redact_url(self.host),
            "error": self.error,
            "options": self.options.public(),
        }
        if self.plan_mismatch is not None:
            s["plan_mismatch"] = self.plan_mismatch
        if self.share is not None:  # known before the probe: a run that never sent has it
            s.update(
                num_open_requests=self.share.num_open,
                num_closed_loops=len(self.share.closed_loops),
                num_sessions=len(self.share.sessions),
            )
        if self.writer is not None:
            w, d = self.writer, self.dispatcher
            plan = cast(Plan, self.plan)  # built before the writer
            s.update(
                profile=plan.profile.name,
                seed=plan.seed,
                duration_s=plan.duration_s,
                run_start_unix=self.start_at,
                run_end_unix=clock.unix_now(),
                rows=w.num_rows,
                status_counts=w.status_counts,
                records_file=w.path.name,
                model=self.info.model,
                continuous_usage=self.info.continuous_usage,
                tokenize=self.info.tokenize,
                probe_requests=self.info.probe_requests,
                prompts=cast(PromptChoice, self.info.prompts).to_dict(),
                retried=w.num_retried,
                server_clock_epoch_unix=self.info.clock_epoch_unix,
                http_client=self.options.http_client,
                max_in_flight=self.options.max_in_flight,
                stopped_sending_unix=d.stopped_at if d else None,
                cut_in_flight=d.cut_in_flight if d else 0,
                not_sent=d.not_sent if d else 0,
                turns_after_failure=d.turns_after_failure if d else 0,
                cut_is_failure=self.cut_is_failure,
                **w.lag_stats(self.options.lag_limit_ms / 1e3),
            )
            w.write_summary(s)
            w.close()
            if s["generator_limited"]:
                warn_generator_limited([s])
        self.summary = s
        self.ended.set()
        self.on_finished(self, s)
