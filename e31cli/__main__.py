from e31cli import main

main.run()
