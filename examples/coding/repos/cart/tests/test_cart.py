from cart import Cart


def test_no_discount():
    cart = Cart()
    cart.add("pen", 2.5, quantity=4)
    assert cart.total() == 10.0


def test_ten_percent():
    cart = Cart(discount_percent=10)
    cart.add("book", 50.0)
    assert cart.total() == 45.0
