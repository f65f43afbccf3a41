"""A bank: accounts with balances in cents and a transaction ledger. Tools reach it as ``state.bank``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from envfactory import ToolError, tool

__all__ = ["Account", "Transaction", "Bank", "TOOLS", "fmt"]


class Account(BaseModel):
    id: str
    owner: str
    kind: Literal["checking", "savings", "card"]
    balance_cents: int
    frozen: bool = False


class Transaction(BaseModel):
    id: int
    source: str | None
    target: str | None
    amount_cents: int
    memo: str = ""


class Bank(BaseModel):
    accounts: dict[str, Account] = Field(default_factory=dict)
    ledger: list[Transaction] = Field(default_factory=list)


def fmt(cents: int) -> str:
    """Cents as a decimal amount string: 123456 -> '1234.56'."""
    sign = "-" if cents < 0 else ""
    cents = abs(cents)
    return f"{sign}{cents // 100}.{cents % 100:02d}"


def _cents(amount: float) -> int:
    cents = round(amount * 100)
    if abs(amount * 100 - cents) > 1e-6:
        raise ToolError(f"amount {amount} has more than two decimal places")
    if cents <= 0:
        raise ToolError("amount must be positive")
    return cents


def _account(bank: Bank, account_id: str) -> Account:
    try:
        return bank.accounts[account_id]
    except KeyError:
        raise ToolError(f"no account {account_id!r}; call list_accounts to see the ids") from None


def _usable(acct: Account) -> Account:
    if acct.frozen:
        raise ToolError(f"account {acct.id} is frozen")
    return acct


@tool(read_only=True)
def list_accounts(state: Any, owner: str | None = None) -> str:
    """List accounts (id, owner, kind, balance, frozen), optionally of one owner.

    Args:
        owner: Only this owner's accounts (case-insensitive).
    """
    rows = [
        f"{a.id} | owner={a.owner} | {a.kind} | balance={fmt(a.balance_cents)}"
        + (" | FROZEN" if a.frozen else "")
        for a in state.bank.accounts.values()
        if owner is None or a.owner.lower() == owner.lower()
    ]
    return "\n".join(rows) if rows else "No accounts."


@tool(read_only=True)
def get_balance(state: Any, account_id: str) -> str:
    """Return the balance of an account.

    Args:
        account_id: The account id, e.g. 'ACC-100'.
    """
    return fmt(_account(state.bank, account_id).balance_cents)


@tool(read_only=True)
def list_transactions(state: Any, account_id: str) -> str:
    """List the transactions that touched an account, oldest first.

    Args:
        account_id: The account id.
    """
    bank = state.bank
    _account(bank, account_id)
    rows = [
        f"#{t.id} | from={t.source or 'cash'} | to={t.target or 'cash'} | amount={fmt(t.amount_cents)}"
        + (f" | memo={t.memo}" if t.memo else "")
        for t in bank.ledger
        if account_id in (t.source, t.target)
    ]
    return "\n".join(rows) if rows else "No transactions."


def _record(bank: Bank, source: str | None, target: str | None, cents: int, memo: str) -> int:
    tid = len(bank.ledger) + 1
    bank.ledger.append(Transaction(id=tid, source=source, target=target, amount_cents=cents, memo=memo))
    return tid


@tool
def transfer(state: Any, source_id: str, target_id: str, amount: float, memo: str = "") -> str:
    """Move money from one account to another.

    Args:
        source_id: Account to take the money from.
        target_id: Account to put the money into.
        amount: Amount in currency units, at most two decimals (e.g. 12.50).
        memo: Optional note stored with the transaction.
    """
    bank = state.bank
    cents = _cents(amount)
    src = _usable(_account(bank, source_id))
    dst = _usable(_account(bank, target_id))
    if src.id == dst.id:
        raise ToolError("source and target are the same account")
    if src.balance_cents < cents:
        raise ToolError(f"insufficient funds in {src.id}: balance {fmt(src.balance_cents)}")
    src.balance_cents -= cents
    dst.balance_cents += cents
    tid = _record(bank, src.id, dst.id, cents, memo)
    return f"Transaction #{tid}: moved {fmt(cents)} from {src.id} to {dst.id}."


@tool
def deposit(state: Any, account_id: str, amount: float) -> str:
    """Deposit cash into an account.

    Args:
        account_id: The account id.
        amount: Amount in currency units, at most two decimals.
    """
    bank = state.bank
    cents = _cents(amount)
    acct = _usable(_account(bank, account_id))
    acct.balance_cents += cents
    tid = _record(bank, None, acct.id, cents, "deposit")
    return f"Transaction #{tid}: deposited {fmt(cents)} into {acct.id}."


@tool
def freeze_account(state: Any, account_id: str) -> str:
    """Freeze an account: no money can move in or out until it is unfrozen.

    Args:
        account_id: The account id.
    """
    acct = _account(state.bank, account_id)
    if acct.frozen:
        raise ToolError(f"account {acct.id} is already frozen")
    acct.frozen = True
    return f"Account {acct.id} is frozen."


@tool
def unfreeze_account(state: Any, account_id: str) -> str:
    """Unfreeze a frozen account.

    Args:
        account_id: The account id.
    """
    acct = _account(state.bank, account_id)
    if not acct.frozen:
        raise ToolError(f"account {acct.id} is not frozen")
    acct.frozen = False
    return f"Account {acct.id} is active again."


TOOLS = [list_accounts, get_balance, list_transactions, transfer, deposit, freeze_account,
         unfreeze_account]
