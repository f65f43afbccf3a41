"""Bank-v0: move money, answer balance questions and handle card incidents."""

from __future__ import annotations

from envfactory import ToolEnvSpec, State, Task, call, register
from envfactory.factory.tasks.synthesis import SynthConfig, synthesize
from tools.banking import TOOLS, Account, Bank, Transaction


class BankState(State):
    bank: Bank


_ACCOUNTS = [
    ("ACC-100", "alice", "checking", 250_000), ("ACC-101", "alice", "savings", 1_200_000),
    ("ACC-102", "alice", "card", 18_050), ("ACC-200", "bob", "checking", 43_075),
    ("ACC-201", "bob", "savings", 90_000), ("ACC-202", "bob", "card", 5_000),
    ("ACC-300", "carol", "checking", 10_000), ("ACC-301", "carol", "savings", 25_000),
    ("ACC-900", "landlord", "checking", 1_000_000),
]
_LEDGER = [(1, None, "ACC-100", 250_000, "salary"), (2, "ACC-200", "ACC-102", 4_500, "dinner"),
           (3, "ACC-100", "ACC-300", 2_000, "book club"), (4, None, "ACC-201", 90_000, "deposit")]


def world() -> BankState:
    return BankState(bank=Bank(
        accounts={i: Account(id=i, owner=o, kind=k, balance_cents=b) for i, o, k, b in _ACCOUNTS},
        ledger=[Transaction(id=i, source=s, target=t, amount_cents=a, memo=m) for i, s, t, a, m in _LEDGER],
    ))


def tasks() -> list[Task]:
    out: list[Task] = []

    def add(instruction: str, solution: list, facts: list[str] | None = None, *, computed: bool = False) -> None:
        # computed: the answer is worked out from what was read (a total), not read itself
        out.append(Task(id=f"bank-{len(out):03d}", instruction=instruction, initial_state=world(),
                        solution=solution, answer_facts=facts or [], answer_seen=not computed))

    # 1 call
    add("What is the balance of account ACC-200?", [call("get_balance", account_id="ACC-200")], ["430.75"])
    add("What is the balance of alice's card account ACC-102?", [call("get_balance", account_id="ACC-102")],
        ["180.50"])
    add("Deposit 40.00 in cash into ACC-300.", [call("deposit", account_id="ACC-300", amount=40.0)])
    add("Transfer 25.50 from ACC-200 to ACC-300 with memo 'lunch'.",
        [call("transfer", source_id="ACC-200", target_id="ACC-300", amount=25.5, memo="lunch")])
    add("Freeze account ACC-202; the card was lost.", [call("freeze_account", account_id="ACC-202")])
    add("How many accounts does carol have? Answer with the number.",
        [call("list_accounts", owner="carol")], ["2"], computed=True)
    add("What was the memo of the transaction from ACC-100 to ACC-300?",
        [call("list_transactions", account_id="ACC-300")], ["book club"])
    # 2 calls
    add("Pay alice's rent: transfer 1200.00 from her checking account to the landlord's checking "
        "account with memo 'rent'.",
        [call("list_accounts"),
         call("transfer", source_id="ACC-100", target_id="ACC-900", amount=1200.0, memo="rent")])
    add("Move everything from carol's savings account into her checking account.",
        [call("list_accounts", owner="carol"),
         call("transfer", source_id="ACC-301", target_id="ACC-300", amount=250.0)])
    add("Bob's card ACC-202 should keep exactly 20.00; move the rest to his checking account ACC-200.",
        [call("get_balance", account_id="ACC-202"),
         call("transfer", source_id="ACC-202", target_id="ACC-200", amount=30.0)])
    add("Refund the dinner: send the amount of the 'dinner' transaction back from ACC-102 to "
        "ACC-200 with memo 'refund'.",
        [call("list_transactions", account_id="ACC-102"),
         call("transfer", source_id="ACC-102", target_id="ACC-200", amount=45.0, memo="refund")])
    add("What is bob's total balance across all his accounts? Answer as a number with two decimals.",
        [call("list_accounts", owner="bob")], ["1380.75"], computed=True)
    add("Unfreeze nothing, but freeze every card account of alice.",
        [call("list_accounts", owner="alice"), call("freeze_account", account_id="ACC-102")])
    # 3 calls
    add("Split the 90.00 dinner bill: alice (ACC-100), bob (ACC-200) and carol (ACC-300) each "
        "transfer 30.00 to the landlord account ACC-900 with memo 'dinner'.",
        [call("transfer", source_id="ACC-100", target_id="ACC-900", amount=30.0, memo="dinner"),
         call("transfer", source_id="ACC-200", target_id="ACC-900", amount=30.0, memo="dinner"),
         call("transfer", source_id="ACC-300", target_id="ACC-900", amount=30.0, memo="dinner")])
    add("Bob lost his card: move its whole balance to his savings account, then freeze the card.",
        [call("list_accounts", owner="bob"),
         call("transfer", source_id="ACC-202", target_id="ACC-201", amount=50.0),
         call("freeze_account", account_id="ACC-202")])
    add("Deposit 100.00 into ACC-300, then transfer 110.00 from ACC-300 to ACC-301.",
        [call("deposit", account_id="ACC-300", amount=100.0),
         call("transfer", source_id="ACC-300", target_id="ACC-301", amount=110.0)])
    # 4 and more
    add("Consolidate bob's money: move the full balances of his savings and card accounts into his "
        "checking account, then freeze the card, and report the new checking balance.",
        [call("list_accounts", owner="bob"),
         call("transfer", source_id="ACC-201", target_id="ACC-200", amount=900.0),
         call("transfer", source_id="ACC-202", target_id="ACC-200", amount=50.0),
         call("freeze_account", account_id="ACC-202")], ["1380.75"], computed=True)
    add("Carol must pay 400.00 rent to ACC-900 from her checking account (memo 'rent'). First move "
        "all of her savings into her checking account, then have alice cover the remaining shortfall "
        "with a transfer from ACC-100 to carol's checking (memo 'loan'), then pay the rent.",
        [call("list_accounts", owner="carol"),
         call("transfer", source_id="ACC-301", target_id="ACC-300", amount=250.0),
         call("transfer", source_id="ACC-100", target_id="ACC-300", amount=50.0, memo="loan"),
         call("transfer", source_id="ACC-300", target_id="ACC-900", amount=400.0, memo="rent")])
    add("Alice wants 5000.00 moved from savings to checking, then 1500.00 from checking to the "
        "landlord ACC-900 (memo 'rent'), then 100.00 from checking to her card ACC-102 (memo "
        "'top up'); report her checking balance afterwards.",
        [call("transfer", source_id="ACC-101", target_id="ACC-100", amount=5000.0),
         call("transfer", source_id="ACC-100", target_id="ACC-900", amount=1500.0, memo="rent"),
         call("transfer", source_id="ACC-100", target_id="ACC-102", amount=100.0, memo="top up"),
         call("get_balance", account_id="ACC-100")], ["5900.00"])
    add("A fraud alert on alice's card ACC-102: freeze it, then deposit 25.00 into ACC-100 as a "
        "goodwill credit, transfer 180.50 from ACC-101 to ACC-100 with memo 'card balance', and "
        "report alice's checking balance.",
        [call("freeze_account", account_id="ACC-102"),
         call("deposit", account_id="ACC-100", amount=25.0),
         call("transfer", source_id="ACC-101", target_id="ACC-100", amount=180.5, memo="card balance"),
         call("get_balance", account_id="ACC-100")], ["2705.50"])
    add("Month-end for bob: deposit 200.00 in cash into his checking ACC-200; transfer 150.00 "
        "from it to his savings ACC-201 (memo 'save'); pay 45.00 from it to ACC-300 (memo "
        "'tickets'); top up his card ACC-202 with 20.00 from it (memo 'top up'); then report his "
        "checking balance.",
        [call("deposit", account_id="ACC-200", amount=200.0),
         call("transfer", source_id="ACC-200", target_id="ACC-201", amount=150.0, memo="save"),
         call("transfer", source_id="ACC-200", target_id="ACC-300", amount=45.0, memo="tickets"),
         call("transfer", source_id="ACC-200", target_id="ACC-202", amount=20.0, memo="top up"),
         call("get_balance", account_id="ACC-200")], ["415.75"])
    return out + synthesize(SPEC.all_tools, SYNTH, n=SYNTHESIZED, seed=0)


# Tasks beyond the hand-written ones are synthesized by walking the tools (envfactory.factory).
SYNTHESIZED = 40
SYNTH = SynthConfig(
    sample_state=lambda rng: world(),
    arguments={"amount": [5.0, 12.5, 20.0, 75.25, 150.0], "memo": ["groceries", "gift", "repairs"],
               "owner": "values:bank.accounts.*.owner"},
    read_share=0.15, prefix="banksyn",
)

SPEC = register(
    ToolEnvSpec(
        name="Bank-v0",
        domain="banking",
        description="Move money, answer balance questions and handle card incidents.",
        state_type=BankState,
        tools=TOOLS,
        tasks=tasks,
        metadata={"synth": SYNTH},
        max_turns=20,
    )
)
