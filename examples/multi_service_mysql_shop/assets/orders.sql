-- The shop's orders as a trial starts: the sql_dump seed, applied with the server's own client.
CREATE TABLE orders (
  id INT PRIMARY KEY,
  customer VARCHAR(40) NOT NULL,
  item VARCHAR(40) NOT NULL,
  status VARCHAR(20) NOT NULL
) DEFAULT CHARSET=utf8mb4;
INSERT INTO orders VALUES
  (1, 'ada', 'kettle', 'shipped'),
  (2, 'grace', 'toaster', 'pending'),
  (3, 'linus', 'teapot', 'cancelled');
CREATE USER 'reporter'@'%' IDENTIFIED BY 'reporter';
GRANT SELECT ON shop.orders TO 'reporter'@'%';
