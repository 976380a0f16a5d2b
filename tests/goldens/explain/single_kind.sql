-- title: one kind alone has no collation; MIN over an append-only source needs no tower; a global aggregate
-- sources: orders(o_orderkey, o_custkey, o_totalprice, o_orderdate); events(e_id, e_kind, e_amount)
-- append-only: events
CREATE VIEW revenue_per_customer AS
SELECT o_custkey, sum(o_totalprice) AS revenue, count(*) AS orders FROM orders GROUP BY o_custkey;
CREATE VIEW first_event_per_kind AS
SELECT e_kind, min(e_amount) AS smallest, max(e_id) AS last_id FROM events GROUP BY e_kind;
CREATE VIEW order_totals AS
SELECT count(*) AS n, sum(o_totalprice) AS total, max(o_orderdate) AS latest FROM orders
