-- sources: orders(o_orderkey, o_custkey, o_totalprice); customer(c_custkey, c_name)
-- case: unknown column
CREATE VIEW v AS
SELECT o_orderkey, o_nope FROM orders
-- case: unknown qualifier
CREATE VIEW v AS SELECT x.o_orderkey FROM orders o
-- case: unknown table
CREATE VIEW v AS SELECT * FROM ordrs
-- case: outer join of three inputs in an aliased parenthesized join
CREATE VIEW v AS
SELECT o_orderkey FROM (orders o LEFT JOIN customer c ON o.o_custkey = c.c_custkey LEFT JOIN customer d ON d.c_custkey = o.o_custkey) AS t
-- case: outer join condition on the preserved side
CREATE VIEW v AS SELECT o_orderkey FROM orders LEFT JOIN customer ON o_custkey = c_custkey AND o_totalprice > 10
-- case: outer join non-equi condition
CREATE VIEW v AS SELECT o_orderkey FROM orders FULL JOIN customer ON o_custkey < c_custkey
-- case: cross join without key
CREATE VIEW v AS SELECT o_orderkey FROM orders, customer WHERE o_totalprice > 10
-- case: join using a column the left side lacks
CREATE VIEW v AS SELECT o_orderkey FROM orders o JOIN customer c USING (c_custkey)
-- case: ambiguous column
CREATE VIEW v AS SELECT o1.o_orderkey FROM orders o1 JOIN orders o2 ON o1.o_custkey = o2.o_custkey WHERE o_totalprice > 1
-- case: same name twice in FROM
CREATE VIEW v AS SELECT o_orderkey FROM orders JOIN orders ON o_custkey = o_custkey
-- case: computed join key
CREATE VIEW v AS SELECT c_name FROM customer c JOIN (SELECT o_custkey + 1 AS k FROM orders) o ON c.c_custkey = o.k
-- case: column neither grouped nor aggregated
CREATE VIEW v AS SELECT o_custkey, o_orderkey, sum(o_totalprice) AS s FROM orders GROUP BY o_custkey
-- case: aggregate in WHERE
CREATE VIEW v AS SELECT o_orderkey FROM orders WHERE sum(o_totalprice) > 10
-- case: unsupported aggregate
CREATE VIEW v AS SELECT o_custkey, first(o_totalprice) AS f FROM orders GROUP BY o_custkey
-- case: count distinct over two columns
CREATE VIEW v AS SELECT count(DISTINCT o_custkey, o_totalprice) AS n FROM orders
-- case: limit without order by
CREATE VIEW v AS SELECT o_orderkey FROM orders LIMIT 10
-- case: last_value over the default frame
CREATE VIEW v AS SELECT o_orderkey, last_value(o_custkey) OVER (ORDER BY o_totalprice) AS lv FROM orders
-- case: a window function not maintained
CREATE VIEW v AS SELECT o_orderkey, collect_list(o_custkey) OVER (PARTITION BY o_custkey) AS l FROM orders
-- case: a grouped query with window calls ordered by an aggregate
CREATE VIEW v AS SELECT o_custkey, count(*) AS n, rank() OVER (ORDER BY count(*)) AS r FROM orders GROUP BY o_custkey ORDER BY sum(o_totalprice) LIMIT 3
-- case: order by an unselected expression after distinct
CREATE VIEW v AS SELECT DISTINCT o_custkey FROM orders ORDER BY o_totalprice LIMIT 3
-- case: bad group size hint
-- ivm: expected_group_size = lots
CREATE VIEW v AS SELECT o_custkey, min(o_totalprice) AS m FROM orders GROUP BY o_custkey
-- case: negative topk spare hint
-- ivm: topk_spare = -3
CREATE VIEW v AS SELECT o_orderkey FROM orders ORDER BY o_totalprice DESC LIMIT 3
-- case: unknown hint
-- ivm: group_size = 10
CREATE VIEW v AS SELECT o_custkey, min(o_totalprice) AS m FROM orders GROUP BY o_custkey
-- case: exists correlated by a condition true for a NULL outer value
CREATE VIEW v AS SELECT o_orderkey FROM orders o WHERE EXISTS (SELECT 1 FROM customer c WHERE c.c_custkey = o.o_custkey OR c.c_nationkey = o.o_orderkey)
-- case: IN with LIMIT correlated by a comparison
CREATE VIEW v AS SELECT o_orderkey FROM orders o WHERE o_custkey IN (SELECT c_custkey FROM customer c WHERE c.c_custkey > o.o_orderkey ORDER BY c_name LIMIT 3)
-- case: subquery in select list that does not aggregate
CREATE VIEW v AS SELECT o_orderkey, (SELECT c_name FROM customer c WHERE c.c_custkey = o_custkey) AS m FROM orders
-- case: scalar subquery correlated through coalesce
CREATE VIEW v AS SELECT o_orderkey FROM orders o WHERE o_totalprice > (SELECT avg(o_totalprice) FROM orders i WHERE i.o_custkey < coalesce(o.o_custkey, 0))
-- case: nondeterministic
CREATE VIEW v AS SELECT o_orderkey, rand() AS r FROM orders
-- case: current_date
CREATE VIEW v AS SELECT o_orderkey FROM orders WHERE o_totalprice > 0 AND current_date() > DATE '2020-01-01'
-- case: expression without alias
CREATE VIEW v AS SELECT o_totalprice * 2 FROM orders
-- case: duplicate output column
CREATE VIEW v AS SELECT o_orderkey, o_custkey AS o_orderkey FROM orders
-- case: reserved column name
CREATE VIEW v AS SELECT o_orderkey AS _diff FROM orders
-- case: syntax error
CREATE VIEW v AS SELECT o_orderkey FROM WHERE
-- case: not a view
SELECT o_orderkey FROM orders
-- case: two statements
CREATE VIEW v AS SELECT o_orderkey FROM orders; CREATE VIEW w AS SELECT o_orderkey FROM orders
-- case: union width
CREATE VIEW v AS SELECT o_orderkey, o_custkey FROM orders UNION ALL SELECT c_custkey FROM customer
-- case: group by rollup
CREATE VIEW v AS SELECT o_custkey, sum(o_totalprice) AS s FROM orders GROUP BY ROLLUP(o_custkey)
-- case: group by cube
CREATE VIEW v AS SELECT o_custkey, sum(o_totalprice) AS s FROM orders GROUP BY CUBE(o_custkey)
-- case: group by grouping sets
CREATE VIEW v AS SELECT o_custkey, sum(o_totalprice) AS s FROM orders GROUP BY GROUPING SETS ((o_custkey), ())
-- case: group by with rollup
CREATE VIEW v AS SELECT o_custkey, sum(o_totalprice) AS s FROM orders GROUP BY o_custkey WITH ROLLUP
-- case: order by an aggregate not selected
CREATE VIEW v AS SELECT o_custkey, sum(o_totalprice) AS s FROM orders GROUP BY o_custkey ORDER BY max(o_orderkey) LIMIT 2
-- case: inner join condition reads a later input
CREATE VIEW v AS SELECT o_orderkey FROM orders o JOIN customer c ON o.o_custkey = x.c_custkey JOIN customer x ON x.c_custkey = c.c_custkey
-- case: IN over a grouped subquery reading the outer row in HAVING
CREATE VIEW v AS SELECT o_orderkey FROM orders o WHERE o_custkey IN (SELECT o_custkey FROM orders i WHERE i.o_totalprice < o.o_totalprice GROUP BY o_custkey HAVING max(i.o_orderkey) > o.o_orderkey)
-- case: scalar subquery collecting
CREATE VIEW v AS SELECT o_orderkey FROM orders o WHERE size(o_orderkey) > (SELECT size(collect_list(o_orderkey)) FROM orders i WHERE i.o_custkey = o.o_custkey)
-- case: full join using
CREATE VIEW v AS SELECT * FROM orders FULL JOIN orders o2 USING (o_orderkey)
-- case: reserved column prefix
CREATE VIEW v AS SELECT o_orderkey AS _ivm_k0 FROM orders
-- case: a scalar subquery in the select list of a grouped query, reading its aggregate
CREATE VIEW v AS SELECT c_name, count(*) AS n, (SELECT max(o_totalprice) FROM orders i WHERE i.o_custkey = max(c.c_custkey)) AS a FROM customer c GROUP BY c_name
-- case: a scalar subquery's aggregate over the outer row
CREATE VIEW v AS SELECT o_orderkey, (SELECT sum(i.o_totalprice * o.o_totalprice) FROM orders i WHERE i.o_custkey = o.o_custkey) AS s FROM orders o
-- case: a scalar subquery keeping several rows by LIMIT
CREATE VIEW v AS SELECT o_orderkey, (SELECT i.o_totalprice FROM orders i WHERE i.o_custkey = o.o_custkey ORDER BY i.o_orderkey LIMIT 3) AS t FROM orders o
-- case: LIMIT in a subquery without ORDER BY
CREATE VIEW v AS SELECT o_orderkey FROM orders o WHERE o_custkey IN (SELECT c_custkey FROM customer LIMIT 10)
