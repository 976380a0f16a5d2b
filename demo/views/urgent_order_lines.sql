-- A view joined with a source: the line items of large urgent open orders.
CREATE VIEW urgent_order_lines AS
SELECT u.o_orderkey, u.o_totalprice, l.l_linenumber, l.l_quantity, l.l_shipmode
FROM urgent_open_orders u, lineitem l
WHERE u.o_orderkey = l.l_orderkey
