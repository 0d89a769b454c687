"""Leader election on a Lease through the official client against the API stand-in."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client as k8s

from pdscale.controller._leader import LeaseElector
from tests.controller.kube_standin import ApiState, api_standin


class Clock:
    def __init__(self, t: float = 1_800_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def cluster() -> Iterator[tuple[ApiState, k8s.ApiClient, Clock]]:
    state = ApiState()
    clock = Clock()
    with api_standin(state) as url:
        config = k8s.Configuration(host=url)
        config.retries = False
        with k8s.ApiClient(config) as api:
            yield state, api, clock


def _pair(api: k8s.ApiClient, clock: Clock) -> tuple[LeaseElector, LeaseElector]:
    a = LeaseElector(api, "pdscale-system", "pdscale-leader", "a", 15.0, clock)
    b = LeaseElector(api, "pdscale-system", "pdscale-leader", "b", 15.0, clock)
    return a, b


def test_one_leader_and_standby_takes_over_within_the_lease(
        cluster: tuple[ApiState, k8s.ApiClient, Clock]) -> None:
    state, api, clock = cluster
    a, b = _pair(api, clock)
    assert a.step() and a.is_leader()
    assert not b.step() and not b.is_leader()
    spec = state.leases[("pdscale-system", "pdscale-leader")]["spec"]
    assert spec["holderIdentity"] == "a" and spec["renewTime"].startswith("2027-01-15T08:00:00.")
    for _ in range(6):  # a renews every 5 s; b never gets in
        clock.t += 5
        assert a.step() and not b.step()
    # a stops renewing (crashed); b takes over within one lease duration of a's last renewal
    last_renewal = clock.t
    while not b.step():
        clock.t += 1
        assert clock.t - last_renewal <= 15
    assert clock.t - last_renewal <= 15
    assert b.is_leader()
    assert state.leases[("pdscale-system", "pdscale-leader")]["spec"]["leaseTransitions"] == 1
    # a comes back: it sees b's lease and does not act
    assert not a.step() and not a.is_leader()


def test_a_leader_that_cannot_renew_stops_acting_before_anyone_may_take_over(
        cluster: tuple[ApiState, k8s.ApiClient, Clock]) -> None:
    state, api, clock = cluster
    a, b = _pair(api, clock)
    assert a.step()
    state.fail_next = 1000  # the API server is unreachable for a
    clock.t += 5
    assert not a.step() and not a.is_leader()
    assert a.last_error is not None and "503" in a.last_error
    state.fail_next = 0
    # Without a failed call, too: an unrenewed lease stops leading at the renew deadline,
    # which comes before the lease expires for the standby.
    assert a.step()
    clock.t += a.renew_deadline_s
    assert not a.is_leader()
    assert not b.step()  # not expired yet for b
    clock.t += 15
    assert b.step()


def test_racing_candidates_one_wins(cluster: tuple[ApiState, k8s.ApiClient, Clock]) -> None:
    state, api, clock = cluster
    a, b = _pair(api, clock)
    assert a.step()
    clock.t += 100  # a is gone; its lease expired
    state.conflicts = 1  # another candidate writes between b's read and b's write
    assert not b.step() and not b.is_leader()
    assert b.last_error is not None and "409" in b.last_error
    assert b.step() and b.is_leader()  # next round, b reads the new version and wins


def test_release_hands_over_at_once(cluster: tuple[ApiState, k8s.ApiClient, Clock]) -> None:
    _, api, clock = cluster
    a, b = _pair(api, clock)
    assert a.step()
    a.release()
    assert not a.is_leader()
    clock.t += 1.5
    assert b.step()


def test_forbidden_says_which_rbac(cluster: tuple[ApiState, k8s.ApiClient, Clock]) -> None:
    state, api, clock = cluster
    state.forbidden_namespaces.add("pdscale-system")
    a, _ = _pair(api, clock)
    assert not a.step()
    assert a.last_error is not None and "leases.coordination.k8s.io" in a.last_error
    from pdscale.controller._leader import LeaseRejected
    from pdscale.errors import GiveUp

    assert isinstance(a.failure, LeaseRejected) and isinstance(a.failure, GiveUp)
    assert a.failure.adapter == "lease"
