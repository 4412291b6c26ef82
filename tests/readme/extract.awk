# Writes every ```LANG block of a Markdown file to OUT/NAME.EXT, NAME taken from the block's first
# line, "MARK README example: NAME", and prints the names. A block without that line is an error:
# every such block of the README is a program the tests run.
#   awk -v out=DIR -v lang=cpp -v mark=// -v ext=cpp -f extract.awk README.md
BEGIN { head = mark " README example: " }
$0 ~ "^```" lang "[ \t]*$" { inside = 1; name = ""; first = 1; next }
/^```[ \t]*$/ && inside {
  inside = 0
  close(file)
  print name
  next
}
inside {
  if (first) {
    first = 0
    if (index($0, head) == 1 && substr($0, length(head) + 1) ~ /^[a-z0-9-]+$/) {
      name = substr($0, length(head) + 1)
      file = out "/" name "." ext
    } else {
      print "README line " NR ": a " lang " block must start with \"" head "NAME\"" > "/dev/stderr"
      exit 1
    }
  }
  print > file
}
