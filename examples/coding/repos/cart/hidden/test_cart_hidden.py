import pytest
from cart import Cart


def test_subtotal():
    cart = Cart(discount_percent=20)
    cart.add("cup", 3.0, quantity=2)
    cart.add("plate", 4.0)
    assert cart.subtotal() == 10.0


def test_twenty_percent():
    cart = Cart(discount_percent=20)
    cart.add("cup", 3.0, quantity=2)
    cart.add("plate", 4.0)
    assert cart.total() == 8.0


def test_half_price():
    cart = Cart(discount_percent=50)
    cart.add("lamp", 19.98)
    assert cart.total() == 9.99


def test_free():
    cart = Cart(discount_percent=100)
    cart.add("gift", 12.0)
    assert cart.total() == 0.0


def test_empty_cart():
    assert Cart(discount_percent=15).total() == 0.0


def test_bad_discount():
    with pytest.raises(ValueError):
        Cart(discount_percent=120)
