import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;

/**
 * pgjdbc against onehop's Postgres listener: a prepared statement run ten times (pgjdbc
 * switches to a named server-side statement after five), typed parameters, a transaction with
 * autocommit off, RETURNING, and a refusal's SQLSTATE. Prints one line per check.
 *
 * Arguments: port user password ca.pem
 */
public class JdbcClient {
    public static void main(String[] args) throws Exception {
        String url = "jdbc:postgresql://127.0.0.1:" + args[0] + "/onehop";
        Properties properties = new Properties();
        properties.setProperty("user", args[1]);
        properties.setProperty("password", args[2]);
        properties.setProperty("ssl", "true");
        properties.setProperty("sslmode", "verify-full");
        properties.setProperty("sslrootcert", args[3]);
        try (Connection connection = DriverManager.getConnection(url, properties)) {
            try (Statement statement = connection.createStatement()) {
                statement.execute("CREATE TABLE jdbc_items (id TEXT PRIMARY KEY, name TEXT, qty BIGINT)");
            }
            List<Integer> counts = new ArrayList<>();
            try (PreparedStatement insert =
                    connection.prepareStatement("INSERT INTO jdbc_items (id, name, qty) VALUES (?, ?, ?)");
                 PreparedStatement count =
                    connection.prepareStatement("SELECT COUNT(*) FROM jdbc_items WHERE qty >= ?")) {
                for (int i = 0; i < 10; i++) {
                    insert.setString(1, "i" + i);
                    insert.setString(2, "item " + i);
                    insert.setLong(3, i * 10L);
                    insert.executeUpdate();
                    count.setLong(1, 50L);
                    try (ResultSet rows = count.executeQuery()) {
                        rows.next();
                        counts.add(rows.getInt(1));
                    }
                }
            }
            System.out.println("prepared " + counts);

            connection.setAutoCommit(false);
            try (PreparedStatement update =
                    connection.prepareStatement("UPDATE jdbc_items SET qty = qty + ? WHERE id = ? RETURNING id, qty")) {
                for (String id : new String[] {"i1", "i2"}) {
                    update.setLong(1, 1000L);
                    update.setString(2, id);
                    try (ResultSet rows = update.executeQuery()) {
                        rows.next();
                        System.out.println("returning " + rows.getString(1) + " " + rows.getLong(2));
                    }
                }
            }
            connection.commit();
            connection.setAutoCommit(true);
            // Described before it runs (Parse and Describe of the statement): RETURNING's
            // columns, and nothing deleted.
            try (PreparedStatement described =
                    connection.prepareStatement("DELETE FROM jdbc_items WHERE id = ? RETURNING id, qty")) {
                java.sql.ResultSetMetaData meta = described.getMetaData();
                System.out.println("described " + meta.getColumnCount() + " " + meta.getColumnName(1) + " "
                    + meta.getColumnName(2));
            }
            try (Statement statement = connection.createStatement();
                 ResultSet rows = statement.executeQuery(
                     "SELECT id, name, qty FROM jdbc_items WHERE qty > 900 ORDER BY id")) {
                List<String> read = new ArrayList<>();
                while (rows.next()) {
                    read.add(rows.getString("id") + ":" + rows.getString("name") + ":" + rows.getLong("qty"));
                }
                System.out.println("read " + read);
            }
            try (Statement statement = connection.createStatement()) {
                statement.executeQuery("SELECT * FROM nowhere");
                System.out.println("not refused");
            } catch (SQLException error) {
                System.out.println("refused " + error.getSQLState());
            }
        }
    }
}
