"""A last-in, first-out stack."""


class Stack:
    def __init__(self):
        self._items = []

    def push(self, item):
        self._items.append(item)

    def pop(self):
        """Remove and return the top item; IndexError when empty."""
        if not self._items:
            raise IndexError("pop from an empty stack")
        return self._items.pop()

    def peek(self):
        """The top item, left in place; IndexError when empty."""
        return self._items[0]

    def __len__(self):
        return len(self._items)

    def is_empty(self):
        return not self._items
