"""A brokerage account with cash, positions, limit orders and a watchlist."""

from typing import Literal


class Brokerage:
    """A brokerage account: quotes, market buys and sells, limit orders, a watchlist."""

    def __init__(self, cash=10000.0, prices=None, positions=None, orders=None, watchlist=None):
        self.cash = float(cash)
        self.prices = dict(prices or {"ACME": 120.0, "GLOBO": 45.5, "INITECH": 12.25, "UMBR": 300.0})
        self.positions = dict(positions or {"ACME": 10})
        self.orders = dict(orders or {})
        self.watchlist = list(watchlist or [])
        self.next_order = 1

    def quote(self, symbol: str) -> str:
        """The last price of a symbol.

        Args:
            symbol: Ticker symbol, e.g. 'ACME'.
        """
        if symbol not in self.prices:
            raise KeyError(f"unknown symbol {symbol!r}")
        return f"{symbol} last {self.prices[symbol]:.2f}"

    def portfolio(self) -> str:
        """Cash, positions (shares) and open orders."""
        pos = ", ".join(f"{s} {q}" for s, q in sorted(self.positions.items())) or "none"
        orders = ", ".join(f"{i}: {o['side']} {o['quantity']} {o['symbol']} @ {o['limit']:.2f}"
                           for i, o in sorted(self.orders.items())) or "none"
        return f"cash {self.cash:.2f}; positions: {pos}; open orders: {orders}"

    def buy(self, symbol: str, quantity: int) -> str:
        """Buy shares at the last price.

        Args:
            symbol: Ticker symbol.
            quantity: Number of shares (1 to 1000).
        """
        if symbol not in self.prices:
            raise KeyError(f"unknown symbol {symbol!r}")
        if not 1 <= quantity <= 1000:
            raise ValueError("quantity must be 1 to 1000")
        cost = round(self.prices[symbol] * quantity, 2)
        if cost > self.cash:
            raise ValueError(f"insufficient cash: {cost:.2f} needed, {self.cash:.2f} available")
        self.cash = round(self.cash - cost, 2)
        self.positions[symbol] = self.positions.get(symbol, 0) + quantity
        return f"bought {quantity} {symbol} for {cost:.2f}"

    def sell(self, symbol: str, quantity: int) -> str:
        """Sell shares you hold at the last price.

        Args:
            symbol: Ticker symbol.
            quantity: Number of shares.
        """
        held = self.positions.get(symbol, 0)
        if quantity < 1 or quantity > held:
            raise ValueError(f"you hold {held} {symbol}; cannot sell {quantity}")
        self.cash = round(self.cash + self.prices[symbol] * quantity, 2)
        self.positions[symbol] = held - quantity
        if not self.positions[symbol]:
            del self.positions[symbol]
        return f"sold {quantity} {symbol}"

    def place_limit_order(self, symbol: str, side: Literal["buy", "sell"], quantity: int,
                          limit: float) -> str:
        """Place a limit order that rests until cancelled.

        Args:
            symbol: Ticker symbol.
            side: buy or sell.
            quantity: Number of shares (1 to 1000).
            limit: Limit price (positive).
        """
        if symbol not in self.prices:
            raise KeyError(f"unknown symbol {symbol!r}")
        if not 1 <= quantity <= 1000 or limit <= 0:
            raise ValueError("quantity must be 1 to 1000 and the limit positive")
        oid = f"O-{self.next_order}"
        self.next_order += 1
        self.orders[oid] = {"symbol": symbol, "side": side, "quantity": quantity, "limit": limit}
        return f"order {oid} placed"

    def cancel_order(self, order_id: str) -> str:
        """Cancel an open limit order.

        Args:
            order_id: The order id, e.g. 'O-1'.
        """
        if order_id not in self.orders:
            raise KeyError(f"no open order {order_id!r}")
        del self.orders[order_id]
        return f"order {order_id} cancelled"

    def watch(self, symbol: str) -> str:
        """Add a symbol to the watchlist.

        Args:
            symbol: Ticker symbol.
        """
        if symbol not in self.prices or symbol in self.watchlist:
            raise ValueError(f"cannot watch {symbol!r} (unknown or already watched)")
        self.watchlist.append(symbol)
        return f"watching {symbol}"
