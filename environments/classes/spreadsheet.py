"""A spreadsheet of named sheets with cells addressed like 'B3'."""

import re

_CELL = re.compile(r"^[A-H][1-9][0-9]?$")


class Spreadsheet:
    """A workbook of sheets; cells hold numbers or text; SUM over a column range."""

    def __init__(self, sheets=None):
        self.sheets = {name: dict(cells) for name, cells in (sheets or {
            "Budget": {"A1": "item", "B1": "amount", "A2": "rent", "B2": 1200, "A3": "food", "B3": 400},
        }).items()}

    def _sheet(self, sheet):
        if sheet not in self.sheets:
            raise KeyError(f"no sheet {sheet!r}; sheets: {sorted(self.sheets)}")
        return self.sheets[sheet]

    def read_range(self, sheet: str, column: str) -> str:
        """Show every filled cell of one column.

        Args:
            sheet: Sheet name.
            column: Column letter, A to H.
        """
        cells = self._sheet(sheet)
        rows = sorted((int(k[1:]), v) for k, v in cells.items() if k[0] == column)
        return "\n".join(f"{column}{r}: {v}" for r, v in rows) or f"column {column} is empty"

    def set_number(self, sheet: str, cell: str, value: int) -> str:
        """Write a whole number into a cell.

        Args:
            sheet: Sheet name.
            cell: Cell address like 'B4' (columns A-H, rows 1-99).
            value: The number.
        """
        if not _CELL.match(cell):
            raise ValueError(f"bad cell address {cell!r}")
        self._sheet(sheet)[cell] = value
        return f"{sheet}!{cell} = {value}"

    def set_text(self, sheet: str, cell: str, text: str) -> str:
        """Write text into a cell.

        Args:
            sheet: Sheet name.
            cell: Cell address like 'A4'.
            text: The text.
        """
        if not _CELL.match(cell):
            raise ValueError(f"bad cell address {cell!r}")
        self._sheet(sheet)[cell] = text
        return f"{sheet}!{cell} = {text!r}"

    def clear_cell(self, sheet: str, cell: str) -> str:
        """Empty a cell.

        Args:
            sheet: Sheet name.
            cell: Cell address.
        """
        cells = self._sheet(sheet)
        if cell not in cells:
            raise KeyError(f"{sheet}!{cell} is already empty")
        del cells[cell]
        return f"cleared {sheet}!{cell}"

    def sum_column(self, sheet: str, column: str, target: str) -> str:
        """Write the sum of a column's numbers into a target cell of another column.

        Args:
            sheet: Sheet name.
            column: Column to add up.
            target: Cell to write the total into (not in the same column).
        """
        cells = self._sheet(sheet)
        if not _CELL.match(target) or target[0] == column:
            raise ValueError("target must be a valid cell outside the summed column")
        nums = [v for k, v in cells.items() if k[0] == column and isinstance(v, int)]
        if not nums:
            raise ValueError(f"column {column} has no numbers")
        cells[target] = sum(nums)
        return f"{sheet}!{target} = {sum(nums)}"

    def add_sheet(self, name: str) -> str:
        """Create an empty sheet.

        Args:
            name: Sheet name.
        """
        if name in self.sheets:
            raise ValueError(f"sheet {name!r} exists")
        self.sheets[name] = {}
        return f"added sheet {name}"
