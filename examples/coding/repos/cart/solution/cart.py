"""A shopping cart with a percentage discount."""


class Cart:
    def __init__(self, discount_percent=0):
        if not 0 <= discount_percent <= 100:
            raise ValueError("discount_percent must be between 0 and 100")
        self.discount_percent = discount_percent
        self.items = []

    def add(self, name, price, quantity=1):
        """Add ``quantity`` of an item costing ``price`` each."""
        self.items.append((name, price, quantity))

    def subtotal(self):
        return sum(price * quantity for _, price, quantity in self.items)

    def total(self):
        """The subtotal after the discount, rounded to cents."""
        if not self.discount_percent:
            return round(self.subtotal(), 2)
        return round(self.subtotal() * (100 - self.discount_percent) / 100, 2)
