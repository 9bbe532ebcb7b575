"""Lease records (issue 16, store/leases.py) on SQLite and PostgreSQL: a live lease is its
holder's alone, an expired one is taken over (and counted), two replicas claiming at once
split the expired leases between them (PostgreSQL: FOR UPDATE SKIP LOCKED)."""

from __future__ import annotations

import asyncio

import pytest
from store_records import running_transfer

from conftest import POSTGRES_URL
from shellyard.store import Store


async def test_a_live_lease_is_its_holders_alone(store: Store) -> None:
    assert await store.acquire_lease("execution", "ex_1", "rep_a", None, 60)
    assert not await store.acquire_lease("execution", "ex_1", "rep_b", None, 60)
    assert await store.acquire_lease("execution", "ex_1", "rep_a", None, 60)  # again: ours
    assert await store.renew_leases("rep_a", 60) == {("execution", "ex_1")}
    assert await store.renew_leases("rep_b", 60) == set()
    # Nothing to claim: it is alive.
    assert await store.claim_leases("rep_b", None, 60, 10, mode="expired") == []
    await store.release_lease("execution", "ex_1", "rep_b")  # not b's: nothing happens
    assert not await store.acquire_lease("execution", "ex_1", "rep_b", None, 60)
    await store.release_lease("execution", "ex_1", "rep_a")
    assert await store.acquire_lease("execution", "ex_1", "rep_b", None, 60)


async def test_an_expired_lease_is_taken_over_and_counted(store: Store) -> None:
    assert await store.acquire_lease("execution", "ex_2", "rep_a", None, 0.05)
    await asyncio.sleep(0.1)  # rep_a stopped renewing
    claimed = await store.claim_leases("rep_b", None, 60, 10, mode="expired")
    assert [(r.subject_id, r.holder) for r in claimed] == [("ex_2", "rep_a")]
    assert await store.renew_leases("rep_a", 60) == set()  # a's renewal finds it gone
    assert await store.renew_leases("rep_b", 60) == {("execution", "ex_2")}
    assert not await store.acquire_lease("execution", "ex_2", "rep_a", None, 60)
    assert (await store.lease_counts("rep_b")) == {"execution": 1}


async def test_a_homes_scope_is_claimed_only_by_that_home(store: Store) -> None:
    """Local-runner work: only its home's (restarted) server takes it, at once on start."""
    assert await store.acquire_lease("execution", "ex_3", "rep_old", "local:h:/a", 60)
    other = await store.claim_leases("rep_x", "local:h:/b", 60, 10, mode="start")
    assert other == []
    assert await store.claim_leases("rep_x", "local:h:/b", 60, 10, mode="expired") == []
    again = await store.claim_leases("rep_new", "local:h:/a", 60, 10, mode="start")
    assert [r.subject_id for r in again] == ["ex_3"]


async def test_two_replicas_claiming_at_once_split_the_expired_leases(
    pg_schema: str,
) -> None:
    """PostgreSQL: SKIP LOCKED hands each expired lease to exactly one claimer."""
    stores = [await Store.open(POSTGRES_URL, schema_name=pg_schema) for _ in range(3)]
    try:
        for i in range(200):
            assert await stores[0].acquire_lease("execution", f"ex_{i}", "dead", None, 0.01)
        await asyncio.sleep(0.05)
        claims = await asyncio.gather(
            *(
                s.claim_leases(f"rep_{n}", None, 60, 50, mode="expired")
                for n, s in enumerate(stores)
                for _ in range(3)
            )
        )
        taken = [r.subject_id for rows in claims for r in rows]
        assert len(taken) == len(set(taken)), "a lease was claimed twice"
        remaining = await stores[0].claim_leases("rep_last", None, 60, 500, mode="expired")
        assert sorted(taken + [r.subject_id for r in remaining]) == sorted(
            f"ex_{i}" for i in range(200)
        )
    finally:
        for s in stores:
            await s.close()


@pytest.mark.parametrize("attempts", [3])
async def test_the_default_owner_is_made_once_by_concurrent_stores(
    pg_schema: str, attempts: int
) -> None:
    """Issue 16 item 3: stores opening one fresh schema at once (migrations under the advisory
    lock) and asking for the default owner together get the same session and agent."""
    stores = await asyncio.gather(
        *(Store.open(POSTGRES_URL, schema_name=pg_schema) for _ in range(attempts))
    )
    try:
        owners = await asyncio.gather(*(s.default_owner() for s in stores for _ in range(4)))
        assert len({session.id for session, _agent in owners}) == 1
        assert len({agent.id for _session, agent in owners}) == 1
    finally:
        for s in stores:
            await s.close()


async def test_a_lease_acquired_during_a_renewal_is_not_dropped(store: Store) -> None:
    """E11 across replicas: a renewal's answer lists what was held when it ran; a lease taken
    while it ran is not in it and must stay held (dropping it stopped its work while its row
    stayed ours, renewed for ever and never taken over)."""
    from shellyard.control.replicas.leases import LeaseKeeper

    keeper = LeaseKeeper(store, "home_a", "local", ttl_s=60)
    lost: list[str] = []
    keeper.on_lost["delivery"] = lost.append
    assert await keeper.acquire("delivery", "dlv_old", "")
    renew = store.renew_leases

    async def renewal_meanwhile(holder: str, ttl_s: float) -> set[tuple[str, str]]:
        answer = await renew(holder, ttl_s)  # what was held when the renewal ran
        assert await keeper.acquire("delivery", "dlv_new", "")  # taken while it ran
        return answer

    store.renew_leases = renewal_meanwhile  # type: ignore[method-assign]
    await keeper.renew()
    assert lost == []
    assert sorted(keeper.subjects("delivery")) == ["dlv_new", "dlv_old"]


async def test_a_transfer_made_final_releases_its_lease_in_the_same_transaction(
    store: Store,
) -> None:
    """The transfer's end and its lease's end are one write: a wait woken by the end never
    finds the lease still there (CI of stop 46 saw ``leases_of('transfer') == 1`` just after
    ``completed``). Another holder's lease is left alone, and finishing a transfer that
    was already final still lets go of the caller's lease."""
    for transfer_id in ("tr_1", "tr_2"):
        await running_transfer(store, transfer_id)
    assert await store.acquire_lease("transfer", "tr_1", "rep_a", None, 60)
    assert await store.acquire_lease("transfer", "tr_2", "rep_b", None, 60)

    final = await store.finish_transfer("tr_1", "completed", None, "not copied", "rep_a")
    assert final is not None and final.state == "completed"
    assert await store.lease_counts("rep_a") == {}
    # Somebody else's lease stays: only the holder's own goes.
    assert await store.finish_transfer("tr_2", "completed", None, "not copied", "rep_a")
    assert await store.lease_counts("rep_b") == {"transfer": 1}
    # Already final: nothing changes but rep_b's lease of it still goes.
    assert await store.finish_transfer("tr_2", "failed", "x", "not copied", "rep_b") is None
    assert await store.lease_counts("rep_b") == {}


async def test_a_transfers_batch_is_fenced_by_its_copiers_lease(store: Store) -> None:
    """docs/files-and-transfers.md "Transfers across replicas: fenced batches": the fence
    before a batch is applied holds while the copier's lease is its own and the transfer is
    active (and pushes the lease forward); it reports ``lost`` once another replica holds
    the lease and ``ended`` once the transfer is final. A batch recorded by a copier that
    lost the lease changes nothing; one recorded after the end gives the files the end
    skipped their outcome, so the counters still add up to the transfer's files and a
    ``failed`` end with a file in the target reads ``partial``."""
    from shellyard.store.files import ENDED, HELD, LOST

    await running_transfer(store, "tr_1")
    assert await store.acquire_lease("transfer", "tr_1", "rep_a", None, 0.01)
    assert await store.hold_transfer("tr_1", "rep_a", 60) == HELD
    assert not await store.acquire_lease("transfer", "tr_1", "rep_b", None, 60)  # pushed on

    copied = [(0, "copied", None, 3)]
    await store.release_lease("transfer", "tr_1", "rep_a")  # as if it expired, then taken
    assert await store.acquire_lease("transfer", "tr_1", "rep_b", None, 60)
    assert await store.hold_transfer("tr_1", "rep_a", 60) == LOST
    assert await store.record_outcomes("tr_1", copied, None, 0, 1, holder="rep_a") is None
    row = await store.get_transfer("tr_1")
    assert row is not None and row.files_copied == 0 and row.batches == 0

    final = await store.finish_transfer("tr_1", "failed", "x", "not copied", "rep_b")
    assert final is not None and final.files_skipped == 1
    assert await store.hold_transfer("tr_1", "rep_a", 60) == ENDED
    assert await store.record_outcomes("tr_1", copied, None, 0, 1, holder="rep_a") is None
    row = await store.get_transfer("tr_1")
    assert row is not None and row.state == "partial", row
    assert (row.files_copied, row.files_skipped, row.bytes_done) == (1, 0, 1), row
    (entry,) = await store.transfer_files("tr_1", None, 0, 10)
    assert (entry.outcome, entry.target_seq) == ("copied", 3)
