//! The run's state machine (`gpu_defrag_core::run`): every stop reason, the pacing, the
//! units given up, the hold; a property test of its limits; and landing control's
//! decision on a held replacement.
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use gpu_defrag_core::run::{
    Ended, Fate, Hold, HoldStep, Limits, Planned, RunState, Sent, Step, Stop, Verdict,
};
use proptest::prelude::*;

fn t0() -> DateTime<Utc> {
    "2026-12-04T02:00:00Z".parse().unwrap()
}

fn at(s: i64) -> DateTime<Utc> {
    t0() + TimeDelta::seconds(s)
}

fn limits(max_in_flight: usize, max_pending: usize) -> Limits {
    Limits {
        max_in_flight,
        per_workload: 1,
        reschedule_timeout: Duration::from_secs(600),
        max_pending,
    }
}

/// Planned evictions `(batch, workload)`, pods `ns/p0`, `ns/p1`, …
fn steps(of: &[(usize, &str)]) -> Vec<Planned> {
    of.iter()
        .enumerate()
        .map(|(i, (batch, w))| Planned {
            pod: format!("ns/p{i}"),
            batch: *batch,
            workload: Some(w.to_string()),
        })
        .collect()
}

/// A run of four moves in two units, each its own workload, the window ending at 3600 s.
fn run(max_in_flight: usize) -> RunState<usize> {
    let s = steps(&[(0, "a"), (0, "b"), (1, "c"), (1, "d")]);
    RunState::new(s, limits(max_in_flight, 5), at(3600))
}

/// Takes the next step at `now` and sends it when it is a check that passes.
fn send_next(r: &mut RunState<usize>, now: DateTime<Utc>) -> Step {
    match r.next(None, true, now) {
        Step::Check(i) => {
            assert_eq!(r.judged(i, 0, Verdict::Go), Some(Step::Evict(i)));
            r.sent(i, Sent::Evicted(i), now);
            Step::Evict(i)
        }
        other => other,
    }
}

/// Ends every wait as replaced.
fn all_ready(r: &mut RunState<usize>) -> usize {
    r.settle(|_| Some(Ended::Replaced { bounced: false })).len()
}

#[test]
fn a_run_that_sends_every_move_and_sees_every_replacement_ready_succeeds() {
    let mut r = run(1);
    for i in 0..4 {
        assert_eq!(send_next(&mut r, at(i * 60)), Step::Evict(i as usize));
        // One in flight at a time: the next waits for the replacement, until its timeout.
        assert_eq!(
            r.next(None, true, at(i * 60 + 1)),
            Step::Wait {
                until: Some(at(i * 60 + 600) + TimeDelta::milliseconds(1))
            }
        );
        assert_eq!(all_ready(&mut r), 1);
    }
    assert_eq!(r.next(None, true, at(300)), Step::Done(None));
    assert_eq!(r.skipped(), 0);
    assert!(!r.gave_up());
}

#[test]
fn moves_in_flight_finish_before_a_run_that_sent_everything_ends() {
    let mut r = run(4);
    for i in 0..4 {
        assert_eq!(send_next(&mut r, at(0)), Step::Evict(i));
    }
    assert_eq!(r.in_flight().len(), 4);
    assert!(matches!(r.next(None, true, at(1)), Step::Wait { .. }));
    r.settle(|w| (w.detail < 2).then_some(Ended::Replaced { bounced: false }));
    assert!(matches!(r.next(None, true, at(2)), Step::Wait { .. }));
    all_ready(&mut r);
    assert_eq!(r.next(None, true, at(3)), Step::Done(None));
}

#[test]
fn the_window_end_stops_sending_and_lets_moves_in_flight_finish() {
    let mut r = run(1);
    assert_eq!(send_next(&mut r, at(3000)), Step::Evict(0));
    all_ready(&mut r);
    assert_eq!(send_next(&mut r, at(3500)), Step::Evict(1));
    // The window ends while a replacement is in flight: nothing more is sent, the run
    // waits for it (no new Check), then ends as closed.
    assert!(matches!(r.next(None, true, at(3700)), Step::Wait { .. }));
    all_ready(&mut r);
    assert_eq!(
        r.next(None, true, at(3701)),
        Step::Done(Some(Stop::WindowClosed))
    );
    // Nothing in flight at the window's end: closed at once.
    let mut r = run(1);
    assert_eq!(
        r.next(None, true, at(3600)),
        Step::Done(Some(Stop::WindowClosed))
    );
}

#[test]
fn a_replacement_not_ready_within_the_timeout_stalls_the_run_and_the_rest_finish() {
    let mut r = run(2);
    assert_eq!(send_next(&mut r, at(0)), Step::Evict(0));
    assert_eq!(send_next(&mut r, at(100)), Step::Evict(1));
    // At 600 s exactly the first one is still within its timeout.
    assert!(matches!(r.next(None, true, at(600)), Step::Wait { .. }));
    // Past it: stalled; the second one is still waited for, nothing more is sent.
    assert!(matches!(r.next(None, true, at(601)), Step::Wait { .. }));
    let dropped = r.take_dropped();
    assert_eq!(dropped.len(), 1);
    assert_eq!(dropped[0].pod, "ns/p0");
    assert_eq!(r.in_flight().len(), 1);
    all_ready(&mut r);
    match r.next(None, true, at(602)) {
        Step::Done(Some(Stop::Stalled(m))) => assert!(m.contains("ns/p0"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_second_stall_while_finishing_ends_the_run_with_the_first_reason() {
    let mut r = run(2);
    send_next(&mut r, at(0));
    send_next(&mut r, at(300));
    assert!(matches!(r.next(None, true, at(601)), Step::Wait { .. }));
    match r.next(None, true, at(901)) {
        Step::Done(Some(Stop::Stalled(m))) => assert!(m.contains("ns/p0"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(r.take_dropped().len(), 2);
}

#[test]
fn an_eviction_whose_fate_is_unknown_stalls_the_run() {
    let mut r = run(2);
    send_next(&mut r, at(0));
    assert_eq!(r.next(None, true, at(1)), Step::Check(1));
    assert_eq!(r.judged(1, 0, Verdict::Go), Some(Step::Evict(1)));
    r.sent(1, Sent::Unknown("no answer".into()), at(1));
    // The move in flight finishes first.
    assert!(matches!(r.next(None, true, at(2)), Step::Wait { .. }));
    all_ready(&mut r);
    assert_eq!(
        r.next(None, true, at(3)),
        Step::Done(Some(Stop::Stalled("no answer".into())))
    );
}

#[test]
fn pending_gpu_pods_beyond_the_limit_plus_those_in_flight_stop_the_run() {
    let mut r = run(2);
    send_next(&mut r, at(0));
    // 6 pending, 5 allowed + 1 in flight: goes on.
    assert_eq!(r.next(None, true, at(1)), Step::Check(1));
    assert_eq!(r.judged(1, 6, Verdict::Go), Some(Step::Evict(1)));
    r.sent(1, Sent::Evicted(1), at(1));
    all_ready(&mut r);
    // 6 pending, nothing in flight: stops sending.
    assert_eq!(r.next(None, true, at(2)), Step::Check(2));
    assert_eq!(r.judged(2, 6, Verdict::Go), None);
    assert_eq!(
        r.next(None, true, at(2)),
        Step::Done(Some(Stop::PendingPileUp(6)))
    );
}

#[test]
fn lost_leadership_ends_the_run_at_once_even_with_moves_in_flight() {
    let mut r = run(2);
    send_next(&mut r, at(0));
    assert_eq!(
        r.next(None, false, at(1)),
        Step::Done(Some(Stop::LostLeadership))
    );
    assert_eq!(r.in_flight().len(), 1, "left to the new leader");
}

#[test]
fn a_stop_request_ends_the_run_at_once_while_sending_or_finishing() {
    let mut r = run(2);
    send_next(&mut r, at(0));
    assert_eq!(
        r.next(Some("the policy was deleted"), true, at(1)),
        Step::Done(Some(Stop::Requested("the policy was deleted".into())))
    );
    // While finishing after the window closed: the request wins, the wait is not kept.
    let mut r = run(1);
    send_next(&mut r, at(3599));
    assert!(matches!(r.next(None, true, at(3600)), Step::Wait { .. }));
    assert_eq!(
        r.next(Some("suspended"), true, at(3601)),
        Step::Done(Some(Stop::Requested("suspended".into())))
    );
}

#[test]
fn a_refused_verdict_gives_up_its_unit_and_the_next_unit_goes_on() {
    let mut r = run(1);
    assert_eq!(r.next(None, true, at(0)), Step::Check(0));
    assert_eq!(
        r.judged(0, 0, Verdict::Refuse("pdb".into())),
        Some(Step::GiveUp {
            step: 0,
            why: "pdb".into()
        })
    );
    // p1 is in unit 0: not sent, counted as skipped; p2 (unit 1) is next.
    assert_eq!(r.next(None, true, at(1)), Step::Check(2));
    assert_eq!(r.skipped(), 2);
    assert!(r.gave_up());
}

#[test]
fn a_blocked_eviction_gives_up_its_unit_and_a_pod_gone_passes_over() {
    let mut r = run(1);
    assert_eq!(r.next(None, true, at(0)), Step::Check(0));
    assert_eq!(r.judged(0, 0, Verdict::PassOver), None);
    assert_eq!(r.next(None, true, at(0)), Step::Check(1));
    r.judged(1, 0, Verdict::Go);
    r.sent(1, Sent::Refused, at(0));
    assert_eq!(r.next(None, true, at(1)), Step::Check(2));
    r.judged(2, 0, Verdict::Go);
    r.sent(2, Sent::Gone, at(1));
    assert_eq!(r.next(None, true, at(1)), Step::Check(3));
    assert_eq!(r.skipped(), 0, "blocked and gone are counted elsewhere");
    assert!(r.gave_up());
}

#[test]
fn one_workload_waits_for_its_previous_replacement_and_a_bounce_backs_it_off() {
    let s = steps(&[(0, "web"), (1, "web"), (2, "web")]);
    let mut r: RunState<usize> = RunState::new(s, limits(4, 5), at(3600));
    assert_eq!(send_next(&mut r, at(0)), Step::Evict(0));
    // maxUnavailablePerWorkload 1: the second waits though maxInFlight has room.
    assert!(matches!(r.next(None, true, at(1)), Step::Wait { .. }));
    r.settle(|_| Some(Ended::Replaced { bounced: true }));
    assert!(r.backed_off().contains("web"));
    assert_eq!(r.next(None, true, at(2)), Step::Check(1));
    assert_eq!(
        r.judged(1, 0, Verdict::Go),
        Some(Step::GiveUp {
            step: 1,
            why: "its workload bounced back onto a fence".into()
        })
    );
}

#[test]
fn a_resumed_run_waits_for_the_replacements_its_last_process_did_not_see() {
    let mut r = run(1);
    r.resume([gpu_defrag_core::run::InFlight {
        pod: "ns/old".into(),
        workload: Some("z".into()),
        since: at(0),
        resumed: true,
        detail: 99,
    }]);
    assert!(matches!(r.next(None, true, at(1)), Step::Wait { .. }));
    all_ready(&mut r);
    assert_eq!(r.next(None, true, at(2)), Step::Check(0));
}

#[test]
fn an_empty_plan_is_done_at_once() {
    let mut r: RunState<()> = RunState::new(Vec::new(), limits(1, 5), at(3600));
    assert_eq!(r.next(None, true, at(0)), Step::Done(None));
}

#[test]
fn a_hold_ends_when_its_pods_bind_is_released_on_a_stop_or_timeout_and_renominates() {
    let who = vec!["ml/train-0 on n1".to_string()];
    let mut h = Hold::new(at(0), Duration::from_secs(300));
    assert_eq!(h.next(&who, None, true, at(1)), HoldStep::Wait);
    assert_eq!(h.next(&who, None, true, at(2)), HoldStep::Renominate);
    assert_eq!(h.next(&who, None, true, at(3)), HoldStep::Wait);
    assert_eq!(h.next(&[], None, true, at(4)), HoldStep::Over);
    assert_eq!(
        h.next(&who, Some("deleted"), true, at(5)),
        HoldStep::Release(Stop::Requested("deleted".into()))
    );
    assert_eq!(
        h.next(&who, None, false, at(5)),
        HoldStep::Release(Stop::LostLeadership)
    );
    match h.next(&who, None, true, at(300)) {
        HoldStep::Release(Stop::Stalled(m)) => {
            assert!(m.contains("ml/train-0 on n1") && m.contains("300s"), "{m}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_served_pods_fate_is_read_from_where_it_is_bound() {
    assert_eq!(Fate::of(Some(Some("n1")), "n1"), Fate::Served);
    assert_eq!(Fate::of(Some(Some("n2")), "n1"), Fate::BoundElsewhere);
    assert_eq!(Fate::of(Some(None), "n1"), Fate::Binding);
    assert_eq!(Fate::of(None, "n1"), Fate::Gone);
    assert_eq!(Fate::Served.as_str(), "Served");
}

/// One event the shell may report between two steps.
#[derive(Clone, Debug)]
enum Event {
    /// Time passes (seconds).
    Tick(u16),
    /// The waits of these in-flight positions (mod the count) end.
    Ready(u8, bool),
    /// The verdict at the next check: 0 go, 1 pass over, 2 refuse.
    Verdict(u8),
    /// The answer to the next eviction: 0 evicted, 1 gone, 2 refused, 3 unknown.
    Answer(u8),
    /// Pending GPU pods from now on.
    Pending(u8),
    /// A stop request.
    Stop,
    /// Leadership lost.
    Lose,
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        4 => (1u16..900).prop_map(Event::Tick),
        3 => (any::<u8>(), any::<bool>()).prop_map(|(i, b)| Event::Ready(i, b)),
        2 => (0u8..3).prop_map(Event::Verdict),
        2 => (0u8..4).prop_map(Event::Answer),
        1 => (0u8..12).prop_map(Event::Pending),
        1 => Just(Event::Stop),
        1 => Just(Event::Lose),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]
    /// Whatever the cluster does: never more than `maxInFlight` evictions open, never more
    /// than `maxUnavailablePerWorkload` of one workload, no eviction at or after the
    /// window's end, after a stop request or lost leadership, or after the run is done.
    #[test]
    fn a_run_keeps_its_limits_whatever_happens(
        max_in_flight in 1usize..4,
        plan in proptest::collection::vec((0usize..4, 0usize..4), 0..12),
        events in proptest::collection::vec(event(), 0..80),
        window in 60i64..4000,
    ) {
        let s: Vec<Planned> = plan
            .iter()
            .enumerate()
            .map(|(i, (b, w))| Planned { pod: format!("ns/p{i}"), batch: *b, workload: Some(format!("w{w}")) })
            .collect();
        let mut r: RunState<usize> = RunState::new(s, limits(max_in_flight, 5), at(window));
        let (mut now, mut verdict, mut answer, mut pending) = (0i64, 0u8, 0u8, 0usize);
        let (mut stopped, mut lost, mut done) = (false, false, false);
        let mut evicted = 0;
        for e in events {
            match e {
                Event::Tick(s) => now += i64::from(s),
                Event::Ready(i, bounced) => {
                    let n = r.in_flight().len().max(1);
                    let mut k = 0;
                    r.settle(|_| { k += 1; (k % n == usize::from(i) % n).then_some(Ended::Replaced { bounced }) });
                }
                Event::Verdict(v) => verdict = v,
                Event::Answer(a) => answer = a,
                Event::Pending(p) => pending = usize::from(p),
                Event::Stop => stopped = true,
                Event::Lose => lost = true,
            }
            let mut step = r.next(stopped.then_some("stop"), !lost, at(now));
            loop {
                match step {
                    Step::Check(i) => {
                        prop_assert!(!done && !stopped && !lost && now < window);
                        let v = match verdict { 0 => Verdict::Go, 1 => Verdict::PassOver, _ => Verdict::Refuse("no".into()) };
                        match r.judged(i, pending, v) {
                            Some(Step::Evict(i)) => {
                                prop_assert!(r.in_flight().len() < max_in_flight);
                                let w = r.steps()[i].workload.clone();
                                prop_assert_eq!(r.in_flight().iter().filter(|f| f.workload == w).count(), 0);
                                prop_assert!(pending <= 5 + r.in_flight().len());
                                let a = match answer { 0 => Sent::Evicted(i), 1 => Sent::Gone, 2 => Sent::Refused, _ => Sent::Unknown("?".into()) };
                                r.sent(i, a, at(now));
                                evicted += 1;
                            }
                            Some(Step::GiveUp { .. }) | None => {}
                            Some(other) => prop_assert!(false, "judged gave {:?}", other),
                        }
                        step = r.next(stopped.then_some("stop"), !lost, at(now));
                    }
                    Step::Done(_) => { done = true; break; }
                    Step::Wait { until } => {
                        if let Some(u) = until { prop_assert!(u > at(now)); }
                        break;
                    }
                    other => { prop_assert!(false, "next gave {:?}", other); break; }
                }
            }
            prop_assert!(r.in_flight().len() <= max_in_flight);
        }
        prop_assert!(evicted <= plan.len());
    }
}

#[test]
fn landing_control_decides_each_held_pod_by_the_table() {
    use gpu_defrag_core::landing::{Held, Released, held_pod};
    let s = Duration::from_secs;
    let hold = s(30);
    // (sweep, leads, expected, age) → decision
    let table: &[(bool, bool, Option<&str>, u64, Held)] = &[
        // The first pass after start releases whatever was held.
        (true, true, Some("n1"), 1, Held::Release(Released::Swept)),
        (true, false, None, 100, Held::Release(Released::Swept)),
        // The leader nominates an expected replacement onto its planned node, even late.
        (false, true, Some("n1"), 1, Held::Nominate("n1".into())),
        (false, true, Some("n1"), 100, Held::Nominate("n1".into())),
        // The leader holds nothing it does not expect.
        (false, true, None, 1, Held::Release(Released::Unexpected)),
        (false, true, None, 30, Held::Release(Released::TimedOut)),
        // A standby keeps it (the leader may expect it) until the hold times out.
        (false, false, None, 29, Held::Keep),
        (false, false, Some("n1"), 1, Held::Keep),
        (false, false, None, 30, Held::Release(Released::TimedOut)),
    ];
    for (sweep, leads, expected, age, want) in table {
        assert_eq!(
            &held_pod(*sweep, *leads, *expected, s(*age), hold),
            want,
            "sweep {sweep}, leads {leads}, expected {expected:?}, age {age}s"
        );
    }
    assert_eq!(Released::Unexpected.as_str(), "released");
}
