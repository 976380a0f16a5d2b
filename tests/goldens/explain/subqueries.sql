-- title: subqueries made joins: a correlated scalar subquery is its subquery grouped by the correlation (an internal view); EXISTS and IN in a join are joins with the subquery's distinct keys; two views with the same subquery share its internal view; a derived table that aggregates, joined, is an internal view
-- sources: items(id, part, qty, price); parts(pk, brand, size); orders(ok, cust, status)
CREATE VIEW small_lines AS
SELECT i.id, i.qty FROM items i, parts p
WHERE p.pk = i.part AND p.brand = 'B1'
  AND i.qty < (SELECT 0.2 * avg(qty) FROM items WHERE part = p.pk);
CREATE VIEW small_lines_again AS
SELECT id FROM items i
WHERE qty < (SELECT 0.2 * avg(qty) FROM items WHERE part = i.part);
CREATE VIEW with_exists AS
SELECT o.ok, p.brand FROM orders o, parts p
WHERE o.cust = p.pk AND EXISTS (SELECT * FROM items WHERE items.id = o.ok AND qty > 5)
  AND o.status IN (SELECT brand FROM parts GROUP BY brand HAVING count(*) > 2);
CREATE VIEW derived_join AS
SELECT p.brand, t.total FROM parts p
JOIN (SELECT part, sum(price) AS total FROM items GROUP BY part) AS t ON t.part = p.pk
;
CREATE VIEW lines_counted AS
SELECT ok, (SELECT count(*) FROM items WHERE items.id = orders.ok) AS n FROM orders
;
CREATE VIEW orders_without_big_items AS
SELECT o.ok, p.brand FROM orders o JOIN parts p ON p.pk = o.cust
WHERE NOT EXISTS (SELECT * FROM items WHERE items.id = o.ok AND qty > 40)
;
CREATE VIEW above_average AS
SELECT id, price FROM items WHERE price > (SELECT avg(price) FROM items WHERE qty > 1);
CREATE VIEW big_parts AS
SELECT part, sum(price) AS total FROM items GROUP BY part
HAVING sum(price) > (SELECT sum(price) * 0.1 FROM items)
;
CREATE VIEW cheapest_items AS
SELECT id, part, price FROM items i
WHERE NOT EXISTS (SELECT * FROM items j WHERE j.part = i.part AND j.price < i.price);
CREATE VIEW items_of_several_orders AS
SELECT id FROM items i
WHERE EXISTS (SELECT * FROM items j WHERE j.part = i.part AND j.id <> i.id)
