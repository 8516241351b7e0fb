// An application's upload handler registering a document with trioindex in its own JDBC
// transaction: the document row, the application's own row and the indexing job commit or roll
// back together. Run: java -cp postgresql.jar:. Enqueue JDBC_URL KEY STORAGE_KEY SHA256 SIZE
// [rollback]. Prints the outcome ("created" or "unchanged") and the job id.
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;

public class Enqueue {
    public static void main(String[] args) throws Exception {
        String url = args[0], key = args[1], storageKey = args[2], sha256 = args[3];
        long size = Long.parseLong(args[4]);
        boolean rollback = args.length > 5 && args[5].equals("rollback");
        try (Connection conn = DriverManager.getConnection(url)) {
            conn.setAutoCommit(false);
            try (PreparedStatement own = conn.prepareStatement(
                    "INSERT INTO app_uploads (document_key) VALUES (?)")) {
                own.setString(1, key);
                own.executeUpdate();
            }
            try (PreparedStatement enqueue = conn.prepareStatement(
                    "SELECT status, job_id FROM trioindex_enqueue_document(?, ?, ?, ?, ?, ?)")) {
                enqueue.setString(1, key);
                enqueue.setString(2, storageKey);
                enqueue.setString(3, sha256);
                enqueue.setLong(4, size);
                enqueue.setString(5, "text/plain");
                enqueue.setString(6, key);
                try (ResultSet row = enqueue.executeQuery()) {
                    row.next();
                    System.out.println(row.getString("status") + " " + row.getString("job_id"));
                }
            }
            if (rollback) {
                conn.rollback();
            } else {
                conn.commit();
            }
        }
    }
}
